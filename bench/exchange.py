#!/usr/bin/env python
"""Exchange-and-average of one fp32 vector between 2 worker processes on 127.0.0.1.

Three ways, in one invocation, each with its own pair of freshly spawned processes:

  peerd  the real path: SnapshotStore + SegmentServer served by start_exchange_server,
         then per repeat hand_over(round) + plan_round + pair_round(out=) over GrpcTransport
         (the worker's flat round with two peers: each averages half the segments and
         takes the other half from its partner), segments over the bulk lane (raw TCP
         beside gRPC)
  peerd-flat  the same with gossip_round (both average every segment), as before pair_round
  peerd-grpc  the same with the bulk lane off: segments as gRPC streams
  peerd-auth  the same with a job secret: proofs on every request and reply
  peerd-tls   the same under mutual TLS (a throwaway CA made with openssl): the bulk
         lane inside TLS 1.3
  peerd-tls-grpc  mutual TLS with the bulk lane off: segments as gRPC streams over TLS
  peerd-copy  the same, but the snapshot copied (publish) and the average in place,
         as before hand_over (a model on a GPU still takes this path)
  tcp    one plain loopback socket, both directions at once (a sender thread does
         sendall of a memoryview, the main thread recv_into a preallocated bytearray),
         then an in-place torch average
  gloo   torch.distributed gloo: all_reduce(SUM) then div_(2)

Each repeat starts with both processes released by a multiprocessing.Barrier; each
process times from just after the barrier to the moment it holds the average, and
the figure kept for the repeat is the slower of the two. Before every repeat each
process resets its vector to its own initial values (outside the timed region), so
every repeat really averages two different vectors; after the last repeat both
processes check that they hold exactly (v0 + v1) / 2. One warm-up repeat is run and
not counted.

With --netns-cap MBIT[,MBIT…] the processes run on capped links instead of
loopback (needs root): each in a network namespace of its own on one bridge
(peerd.soak.netns, as bench/bandwidth.py), its link capped by tc tbf both ways,
for each cap in turn; every method but gloo. Per cap it adds the bytes each
process's link carried per round (counted at the bridge) and the link's own time
for them (bytes ÷ rate, the floor no method can beat), and the ratios to `peerd`.

Otherwise only 127.0.0.1 is bound. gloo's rendezvous uses a FileStore (file://) rather than
tcp://, because torch's TCPStore listens on every interface; gloo's own sockets are
pinned to the loopback interface with GLOO_SOCKET_IFNAME.

    .venv/bin/python bench/exchange.py                      # 64 MiB, 10 repeats
    .venv/bin/python bench/exchange.py --mib 16 --repeats 5 --methods peerd,gloo
    .venv/bin/python bench/exchange.py --segments 4 --chunk-kib 4096 --json out.json
    sudo .venv/bin/python bench/exchange.py --mib 32 --repeats 10 --netns-cap 1000,100   # peerd,peerd-tls,tcp
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import socket
import statistics
import tempfile
import threading
from pathlib import Path

from harness.exchange import ExchangePeer, grpc_rounds
from harness.netlink import CappedLinks, counted, enter_namespace, link_table
from harness.output import quantile, write_json
from harness.ranks import (
    Rank, RepeatClock, checks, gloo_average, rank_vectors, run_loop, run_ranks, slowest, stop_resource_tracker,
)
from harness.script import arg_parser, each_timed, names, numbers, run_main

# peerd-grpc: no bulk lane; peerd-auth: with a job secret; peerd-tls: under mutual TLS
# (peerd-tls-grpc: and no bulk lane); peerd-copy: the snapshot copied (publish) and
# averaged in place, as before hand_over (and as a model on a GPU still is)
METHODS = ("peerd", "peerd-flat", "peerd-grpc", "peerd-auth", "peerd-tls", "peerd-tls-grpc", "peerd-copy", "tcp",
           "gloo")
TLS_METHODS = ("peerd-tls", "peerd-tls-grpc")
LINK_METHODS = "peerd,peerd-tls,tcp"  # the default with --netns-cap
BARRIER_TIMEOUT_S = 120.0  # a partner that died must not leave the other one waiting forever
JOB = "bench"


# ---------------------------------------------------------------- worker side


def _verify(vector, expected, atol: float = 0.0) -> dict:
    import torch.testing

    torch.testing.assert_close(vector, expected, rtol=0.0, atol=atol)
    return checks(vector)


def _peerd(method: str, cfg: dict, me: Rank) -> dict:
    """One rank of a peerd method: `cfg`'s path through the worker's round."""
    from peerd.security.auth import Authenticator
    from peerd.core.topology import plan_round
    from peerd.security.tls import load_tls
    from peerd.worker.round.crossover import gossip_round
    from peerd.worker.round.pair import pair_round

    _enter(cfg, me)
    hand_over = method != "peerd-copy"
    round_fn = gossip_round if method == "peerd-flat" else pair_round  # pair: as the worker runs two peers
    own0, expected = rank_vectors(me.rank, 2, cfg["numel"])
    peer = ExchangePeer(JOB, f"p{me.rank}", cfg["numel"], cfg["segments"], cfg["chunk_kib"] * 1024 // 4)
    auth = Authenticator(b"bench-job-secret-0123456789") if method == "peerd-auth" else None
    tls = load_tls(cfg["pki"][me.rank]) if method in TLS_METHODS else None
    bulk = method not in ("peerd-grpc", "peerd-tls-grpc")
    clock, profiler = RepeatClock(cfg["warmup"], gc=True, waits=bool(cfg.get("netns"))), _profiler(cfg)

    def rounds(ctx, addresses: dict[str, str]):
        async def one_round(round_: int, vector):
            if profiler is not None and round_ > cfg["warmup"]:
                profiler.enable()
            if hand_over:  # as the worker does with a model on the CPU
                into = await peer.store.hand_over(round_, vector)
            else:
                into = None
                await peer.store.publish(round_, vector)
            clock.lap("publish")
            plan = plan_round(JOB, round_, list(addresses), peer.me, cfg["segments"])
            result = await round_fn(ctx, peer.inputs(plan, addresses, vector, cfg["deadline_s"], into))
            clock.lap("gossip_round")
            if profiler is not None:
                profiler.disable()
            return result, into if into is not None else vector  # the model moves into the buffer the round wrote

        return one_round

    vector = run_loop(lambda: grpc_rounds(peer, me, cfg, rounds, clock, own0.clone(), auth, bulk, tls),
                      cfg["uvloop"])
    if profiler is not None:
        profiler.dump_stats(os.path.join(cfg["profile"], f"peerd-rank{me.rank}.pstats"))
    # Within one rounding of (a + b)·½: gossip_round averages with lerp, in an order
    # both ranks agree on (run_method still checks that they hold the same bits).
    return _report(clock, _verify(vector, expected, atol=1e-6), peerd=True)


def _enter(cfg: dict, me: Rank) -> None:
    """Into this rank's namespace with --netns-cap, before any socket or thread is made."""
    if cfg.get("netns"):
        enter_namespace(cfg["netns"][me.rank])


def _profiler(cfg: dict):
    if not cfg.get("profile"):
        return None
    import cProfile

    return cProfile.Profile()


def _report(clock: RepeatClock, checked: dict, peerd: bool = False) -> dict:
    """A rank's timings: the total, and the sub-steps with process CPU per repeat
    (and the wait for a CPU, when measured); for peerd also the garbage
    collector's share, and which peerd it ran."""
    split = {**clock.split, "cpu": clock.cpu, **({"cpu_wait": clock.waited} if clock.waited else {})}
    if not peerd:
        return {"times": clock.times, "split": split, **checked}
    import peerd as package

    return {"times": clock.times, "split": {**split, "gc": clock.gc}, **checked,
            "source": os.path.dirname(package.__file__)}


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    filled, total = 0, len(view)
    while filled < total:
        n = sock.recv_into(view[filled:], total - filled)
        if n == 0:
            raise ConnectionError(f"partner closed after {filled}/{total} bytes")
        filled += n


def _tcp_socket(me: Rank, hosts: list[str] | None) -> socket.socket:
    """Rank 0 listens on 127.0.0.1 (its own address on a capped link) and accepts;
    rank 1 connects to it."""
    host = hosts[0] if hosts else "127.0.0.1"
    if me.rank == 0:
        with socket.create_server((host, 0)) as listener:
            listener.settimeout(BARRIER_TIMEOUT_S)
            me.share(listener.getsockname()[1], BARRIER_TIMEOUT_S)
            sock, _ = listener.accept()
    else:
        port = me.share(None, BARRIER_TIMEOUT_S)[0]
        sock = socket.create_connection((host, port), timeout=BARRIER_TIMEOUT_S)
    sock.settimeout(BARRIER_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _tcp(cfg: dict, me: Rank) -> dict:
    _enter(cfg, me)
    import torch

    own0, expected = rank_vectors(me.rank, 2, cfg["numel"])
    vector = own0.clone()
    buf = bytearray(cfg["numel"] * 4)
    recv = torch.frombuffer(buf, dtype=torch.float32)  # a view of buf, no copy
    send_view, recv_view = memoryview(vector.numpy()).cast("B"), memoryview(buf)
    clock, errors = RepeatClock(cfg["warmup"], waits=bool(cfg.get("netns"))), []

    def send(sock) -> None:
        try:
            sock.sendall(send_view)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with _tcp_socket(me, cfg.get("hosts")) as sock:
        for _ in range(cfg["warmup"] + cfg["repeats"]):
            vector.copy_(own0)
            me.barrier.wait(BARRIER_TIMEOUT_S)
            clock.start()
            sender = threading.Thread(target=send, args=(sock,), daemon=True)
            sender.start()
            _recv_exact(sock, recv_view)
            sender.join(BARRIER_TIMEOUT_S)
            if sender.is_alive() or errors:
                raise RuntimeError(f"send failed: {errors or 'timed out'}")
            clock.lap("send+recv")
            vector.add_(recv).mul_(0.5)
            clock.stop()
        checked = _verify(vector, expected)
        me.barrier.wait(BARRIER_TIMEOUT_S)
    return _report(clock, checked)


def _gloo(cfg: dict, me: Rank) -> dict:
    got = gloo_average(me, cfg, _verify)
    return {"times": got["times"], "split": {**got["split"], "cpu": got["cpu"]},
            **{k: got[k] for k in ("checksum", "head")}}


# ---------------------------------------------------------------- parent side


def run_method(method: str, cfg: dict) -> dict:
    """The two processes of one method, their timings; the same average on both."""
    entry = (functools.partial(_peerd, method, cfg) if method.startswith("peerd")
             else functools.partial({"tcp": _tcp, "gloo": _gloo}[method], cfg))
    a, b = run_ranks(method, 2, entry, cfg["method_timeout_s"], share=method != "gloo")
    if a["checksum"] != b["checksum"] or a["head"] != b["head"]:
        raise AssertionError(f"{method}: the two processes hold different averages")
    return {
        "source": a.get("source"),
        "times": slowest([a, b], "times"),
        "per_rank": [a["times"], b["times"]],
        # sub-steps: per repeat the slower process's figure, each taken on its own
        "split": {k: slowest([a["split"], b["split"]], k) for k in a["split"]},
    }


def parse_args(argv: list[str] | None = None):
    p = arg_parser(
        __doc__, defaults=True, prog="bench/exchange.py",
        description="Time the exchange-and-average of an fp32 vector between 2 processes on 127.0.0.1 "
        "(or on capped links, --netns-cap): peerd's gRPC segment gossip vs a raw TCP socket vs "
        "torch.distributed gloo all_reduce.",
        epilog="Figures are per repeat the slower of the two processes, in ms; ratios are of medians.")
    p.add_argument("--mib", type=float, default=64, help="vector size in MiB (fp32: 262144 floats per MiB)")
    p.add_argument("--repeats", type=int, default=10, help="timed repeats per method")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up repeats per method")
    p.add_argument("--segments", type=int, default=8, help="peerd segments (job default: 8)")
    p.add_argument("--chunk-kib", type=int, default=1024, help="peerd streamed chunk size in KiB (job default: 1024)")
    p.add_argument("--methods", help="comma-separated subset of: " + ", ".join(METHODS) +
                   f" (default: all; with --netns-cap {LINK_METHODS})")
    p.add_argument("--deadline-s", type=float, default=60.0, help="peerd gossip deadline per round")
    p.add_argument("--no-uvloop", action="store_true", help="run peerd on asyncio's loop even if uvloop is installed "
                   "(the real worker uses uvloop when it can)")
    p.add_argument("--profile", metavar="DIR", help="cProfile the timed peerd repeats (slows them down); writes DIR/peerd-rank{0,1}.pstats, "
                   "read with python -m pstats")
    p.add_argument("--netns-cap", metavar="MBIT[,MBIT…]", help="run the processes on links capped at these "
                   "Mbit/s (tc tbf, both ways), one cap after the other, each in a network namespace of its own, "
                   "instead of on loopback (needs root; every method but gloo)")
    p.add_argument("--json", metavar="OUT", help="also write the raw timings and settings to this file")
    args = p.parse_args(argv)
    args.caps = numbers(p, args.netns_cap, float, "--netns-cap") if args.netns_cap else []
    args.methods = names(p, args.methods or (LINK_METHODS if args.caps else ",".join(METHODS)), METHODS, "--methods")
    if args.caps and ("gloo" in args.methods or min(args.caps) <= 0):
        p.error("--netns-cap: caps must be positive, and gloo runs on loopback only")
    if args.repeats < 1 or args.warmup < 0 or args.segments < 1 or args.chunk_kib < 1 or args.mib <= 0:
        p.error("--repeats, --segments, --chunk-kib and --mib must be positive, --warmup ≥ 0")
    return args


def _uvloop(args) -> bool:
    if args.no_uvloop:
        return False
    try:
        import uvloop as _  # noqa: F401
    except ImportError:
        return False
    return True


def print_table(runs: dict[str, dict]) -> dict[str, float]:
    """The medians per method, the sub-steps, and peerd's ratios; the medians."""
    med = {m: statistics.median(r["times"]) for m, r in runs.items()}
    print()
    print(f"{'method':<10} {'median ms':>10} {'p90 ms':>9} {'min ms':>8} {'max ms':>8} {'x gloo':>7}")
    for m, r in runs.items():
        ratio = f"{med[m] / med['gloo']:.2f}" if "gloo" in med else "-"
        print(f"{m:<10} {med[m] * 1e3:10.1f} {quantile(r['times'], 0.9) * 1e3:9.1f} "
              f"{min(r['times']) * 1e3:8.1f} {max(r['times']) * 1e3:8.1f} {ratio:>7}")
    for m, r in runs.items():
        if r["split"]:
            parts = ", ".join(f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in r["split"].items())
            print(f"  {m} sub-steps (median ms, slower process; cpu = process CPU time, all threads): {parts}")
    print()
    for name, a, b in (("peerd/gloo", "peerd", "gloo"), ("peerd/tcp ", "peerd", "tcp"),
                       ("peerd-auth/peerd", "peerd-auth", "peerd"), ("peerd-tls/peerd", "peerd-tls", "peerd"),
                       ("peerd-tls-grpc/peerd", "peerd-tls-grpc", "peerd")):
        if a in med and b in med:
            cpu = [statistics.median(runs[m]["split"]["cpu"]) for m in (a, b) if "cpu" in runs[m]["split"]]
            print(f"{name} = {med[a] / med[b]:.2f}" + (f" (CPU {cpu[0] / cpu[1]:.2f})" if len(cpu) == 2 else ""))
    return med


def json_report(runs: dict[str, dict], med: dict[str, float], cfg: dict) -> dict:
    import grpc
    import torch

    return {
        "settings": {k: v for k, v in cfg.items() if k not in ("gloo_store", "profile", "barrier_s", "pki")}
        | {"mib": cfg["numel"] * 4 / 2**20, "torch": torch.__version__, "grpcio": grpc.__version__,
           "cpus": os.cpu_count(), "python": platform.python_version()},
        "ms": {m: {"median": med[m] * 1e3, "p90": quantile(r["times"], 0.9) * 1e3,
                   "times": [t * 1e3 for t in r["times"]],
                   "per_rank": [[t * 1e3 for t in ts] for ts in r["per_rank"]],
                   "split": {k: [t * 1e3 for t in v] for k, v in r["split"].items()}}
               for m, r in runs.items()},
        "ratios": {k: med["peerd"] / med[d] for k, d in (("peerd/gloo", "gloo"), ("peerd/tcp", "tcp"))
                   if "peerd" in med and d in med},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numel = int(args.mib * 1024 * 1024) // 4
    if numel < args.segments:
        raise SystemExit("vector smaller than the segment count")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp, contextlib.ExitStack() as stack:
        links = stack.enter_context(CappedLinks(2)) if args.caps else None
        cfg = _settings(args, numel, tmp, links)
        if links is None:
            runs = _each(args.methods, cfg)
            report = json_report(runs, print_table(runs), cfg)
        else:
            report = {}
            for cap in args.caps:
                links.cap(cap)
                print(f"\n{cap:g} Mbit/s both ways, per process", flush=True)
                runs = _each(args.methods, cfg, links)
                report[f"{cap:g} Mbit/s"] = json_report(runs, print_table(runs), cfg) | {
                    "bytes_per_round": {m: r["bytes"] for m, r in runs.items()}}
                print("\n" + link_table(runs, cap), flush=True)
    if args.json:
        write_json(Path(args.json), report, indent=2)
    return 0


def _settings(args, numel: int, tmp: str, links: CappedLinks | None) -> dict:
    """The ranks' settings (said in one line): sizes, repeats, certificates, and
    with --netns-cap their namespaces and addresses."""
    from harness.certs import make_pki
    import grpc
    import torch

    hosts = links.addresses if links else None
    cfg = {"numel": numel, "repeats": args.repeats, "warmup": args.warmup, "segments": args.segments,
           "chunk_kib": args.chunk_kib, "deadline_s": args.deadline_s, "uvloop": _uvloop(args),
           "profile": os.path.abspath(args.profile) if args.profile else None,
           "gloo_store": os.path.join(tmp, "gloo-store"), "barrier_s": BARRIER_TIMEOUT_S,
           "method_timeout_s": 60.0 + args.repeats * 30.0, "hosts": hosts,
           "netns": links.namespaces if links else None,
           "pki": (list(make_pki(Path(tmp) / "pki", ["rank0", "rank1"], tuple(hosts or ["127.0.0.1"])).values())
                   if set(args.methods) & set(TLS_METHODS) else None)}
    where = f"in namespaces {', '.join(hosts)} on capped links" if hosts else "on 127.0.0.1"
    print(f"{numel * 4 / 2**20:g} MiB fp32 ({numel} floats), 2 processes {where}, "
          f"{args.repeats} repeats + {args.warmup} warm-up; peerd: {args.segments} segments, "
          f"{args.chunk_kib} KiB chunks, {'uvloop' if cfg['uvloop'] else 'asyncio'}; "
          f"torch {torch.__version__}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs", flush=True)
    return cfg


def _each(methods: list[str], cfg: dict, links: CappedLinks | None = None) -> dict[str, dict]:
    """Every method in turn; with `links`, the bytes each rank's link carried per round too."""
    rounds = cfg["warmup"] + cfg["repeats"]
    run = ((lambda m: run_method(m, cfg)) if links is None
           else (lambda m: counted(links, rounds, lambda: run_method(m, cfg))))
    return each_timed(methods, run, note=lambda r: ", average verified" + (
        f" (peerd from {r['source']})" if r["source"] else ""))


if __name__ == "__main__":
    run_main(main, after=stop_resource_tracker)
