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

Only 127.0.0.1 is bound. gloo's rendezvous uses a FileStore (file://) rather than
tcp://, because torch's TCPStore listens on every interface; gloo's own sockets are
pinned to the loopback interface with GLOO_SOCKET_IFNAME.

    .venv/bin/python bench/exchange.py                      # 64 MiB, 10 repeats
    .venv/bin/python bench/exchange.py --mib 16 --repeats 5 --methods peerd,gloo
    .venv/bin/python bench/exchange.py --segments 4 --chunk-kib 4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _harness import GcMeter, collect, quantile, rank_entry, reap, run_main, stop_resource_tracker

# peerd-grpc: no bulk lane; peerd-auth: with a job secret; peerd-copy: the snapshot copied
# (publish) and averaged in place, as before hand_over (and as a model on a GPU still is)
METHODS = ("peerd", "peerd-flat", "peerd-grpc", "peerd-auth", "peerd-copy", "tcp", "gloo")
BARRIER_TIMEOUT_S = 120.0  # a partner that died must not leave the other one waiting forever
PEER_IDS = ("a", "b")
JOB = "bench"


# ---------------------------------------------------------------- worker side


def _vectors(rank: int, numel: int):
    """This rank's initial vector and the exact average both ranks must end with."""
    import torch

    own = None
    others = []
    for r in (0, 1):
        v = torch.randn(numel, generator=torch.Generator().manual_seed(1234 + r))
        if r == rank:
            own = v
        others.append(v)
    expected = others[0].add(others[1]).mul_(0.5)  # the same op order as gossip_round / the tcp path
    return own, expected


def _verify(vector, expected, atol: float = 0.0) -> dict:
    import torch
    import torch.testing

    torch.testing.assert_close(vector, expected, rtol=0.0, atol=atol)
    return {"checksum": float(vector.double().sum()), "head": vector[:3].tolist()}


def _peerd(rank: int, cfg: dict, barrier, conn) -> dict:
    import asyncio

    import torch

    import peerd
    from peerd.core.segments import split_even
    from peerd.core.topology import plan_round
    from peerd.worker.round.crossover import gossip_round
    from peerd.worker.round.pair import pair_round
    from peerd.worker.round.context import RoundBuffers, RoundContext, RoundInputs
    from peerd.worker.wire.stores import Identity, SegmentServer, SnapshotStore
    from peerd.worker.state.pull import StateBoard, StateServer
    from peerd.auth import Authenticator
    from peerd.worker.wire.server import start_exchange_server
    from peerd.worker.wire.transport import GrpcTransport

    numel, segments = cfg["numel"], cfg["segments"]
    chunk_elems = cfg["chunk_kib"] * 1024 // 4
    own0, expected = _vectors(rank, numel)
    vector, recv = own0.clone(), torch.empty(numel)
    me = PEER_IDS[rank]
    identity = Identity(JOB, "fp", me)
    layout = split_even(numel, segments)
    profiler = None
    if cfg.get("profile"):
        import cProfile

        profiler = cProfile.Profile()

    async def wait_barrier() -> None:
        # In a thread: the event loop keeps serving the partner while this side waits.
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)

    async def main() -> dict:
        nonlocal vector
        store = SnapshotStore(numel)
        server = SegmentServer(identity, store, segments, chunk_elems)
        state = StateServer(identity, StateBoard(2 * numel, numel), store, chunk_elems)  # newcomers' service, idle here
        bulk = cfg["bulk"]
        auth = Authenticator(b"bench-job-secret-0123456789") if cfg.get("auth") else None
        grpc_server, address = await start_exchange_server(server, state, "127.0.0.1", bulk=bulk, auth=auth)
        transport = GrpcTransport(identity, auth, bulk=bulk)
        ctx = RoundContext(me, layout, transport, server.stages)
        try:
            conn.send(address)
            if not await asyncio.to_thread(conn.poll, BARRIER_TIMEOUT_S):
                raise TimeoutError("partner never sent its address")
            addresses = {me: address, PEER_IDS[1 - rank]: conn.recv()}
            times, publish, gossip, cpu, gcs, gc_meter = [], [], [], [], [], GcMeter()
            for i in range(cfg["warmup"] + cfg["repeats"]):
                # Untimed: reset to this rank's own values, then start together.
                vector.copy_(own0)
                await wait_barrier()
                if profiler is not None and i >= cfg["warmup"]:
                    profiler.enable()
                t0, c0, _ = time.perf_counter(), time.process_time(), gc_meter.take()
                round_ = i + 1
                if cfg["hand_over"]:  # as the worker does with a model on the CPU
                    into = await store.hand_over(round_, vector)
                else:
                    into = None
                    await store.publish(round_, vector)
                t1 = time.perf_counter()
                plan = plan_round(JOB, round_, list(addresses), me, segments)
                inputs = RoundInputs(plan, addresses, RoundBuffers(vector, recv, cfg["deadline_s"], into))
                if cfg["pair"]:  # as the worker runs a flat round with two peers (peerd.worker.round.pair)
                    result = await pair_round(ctx, inputs)
                else:
                    result = await gossip_round(ctx, inputs)
                if into is not None:
                    vector = into  # the model moves into the buffer the round wrote
                t2, c2, gc_s = time.perf_counter(), time.process_time(), gc_meter.take()
                if profiler is not None:
                    profiler.disable()
                if result.misses:
                    raise RuntimeError(f"round {round_}: {result.misses} segment(s) missed: {result.errors}")
                if i >= cfg["warmup"]:
                    times.append(t2 - t0)
                    publish.append(t1 - t0)
                    gossip.append(t2 - t1)
                    cpu.append(c2 - c0)
                    gcs.append(gc_s)
                # Untimed: the partner may still be fetching from this process's server, whose
                # event loop this is; nothing may block the loop until it is done too.
                await wait_barrier()
            if profiler is not None:
                profiler.dump_stats(os.path.join(cfg["profile"], f"peerd-rank{rank}.pstats"))
            # Within one rounding of (a + b)·½: gossip_round averages with lerp, in an order
            # both ranks agree on (run_method still checks that they hold the same bits).
            checks = _verify(vector, expected, atol=1e-6)
            await transport.aclose()
            await wait_barrier()  # both channels closed before either server stops
            return {"times": times, "split": {"publish": publish, "gossip_round": gossip, "cpu": cpu, "gc": gcs},
                    "source": os.path.dirname(peerd.__file__), **checks}
        finally:
            await transport.aclose()
            await grpc_server.stop(grace=None)

    if cfg["uvloop"]:
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    filled, total = 0, len(view)
    while filled < total:
        n = sock.recv_into(view[filled:], total - filled)
        if n == 0:
            raise ConnectionError(f"partner closed after {filled}/{total} bytes")
        filled += n


def _tcp(rank: int, cfg: dict, barrier, conn) -> dict:
    import torch

    numel = cfg["numel"]
    own0, expected = _vectors(rank, numel)
    vector = own0.clone()
    buf = bytearray(numel * 4)
    recv = torch.frombuffer(buf, dtype=torch.float32)  # a view of buf, no copy
    send_view = memoryview(vector.numpy()).cast("B")
    recv_view = memoryview(buf)

    listener = None
    try:
        if rank == 0:
            listener = socket.create_server(("127.0.0.1", 0))
            listener.settimeout(BARRIER_TIMEOUT_S)
            conn.send(listener.getsockname()[1])
            sock, _ = listener.accept()
        else:
            if not conn.poll(BARRIER_TIMEOUT_S):
                raise TimeoutError("partner never sent its port")
            sock = socket.create_connection(("127.0.0.1", conn.recv()), timeout=BARRIER_TIMEOUT_S)
        with sock:
            sock.settimeout(BARRIER_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            errors: list[BaseException] = []

            def send() -> None:
                try:
                    sock.sendall(send_view)
                except BaseException as exc:  # reported by the main thread
                    errors.append(exc)

            times, transfer, cpu = [], [], []
            for i in range(cfg["warmup"] + cfg["repeats"]):
                vector.copy_(own0)
                barrier.wait(BARRIER_TIMEOUT_S)
                t0, c0 = time.perf_counter(), time.process_time()
                sender = threading.Thread(target=send, daemon=True)
                sender.start()
                _recv_exact(sock, recv_view)
                sender.join(BARRIER_TIMEOUT_S)
                if sender.is_alive() or errors:
                    raise RuntimeError(f"send failed: {errors or 'timed out'}")
                t1 = time.perf_counter()
                vector.add_(recv).mul_(0.5)
                t2, c2 = time.perf_counter(), time.process_time()
                if i >= cfg["warmup"]:
                    times.append(t2 - t0)
                    transfer.append(t1 - t0)
                    cpu.append(c2 - c0)
            checks = _verify(vector, expected)
            barrier.wait(BARRIER_TIMEOUT_S)
            return {"times": times, "split": {"send+recv": transfer, "cpu": cpu}, **checks}
    finally:
        if listener is not None:
            listener.close()


def _gloo(rank: int, cfg: dict, barrier, conn) -> dict:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's pair sockets on loopback only
    numel = cfg["numel"]
    own0, expected = _vectors(rank, numel)
    vector = own0.clone()
    dist.init_process_group(
        "gloo", init_method=f"file://{cfg['gloo_store']}", rank=rank, world_size=2,
        timeout=timedelta(seconds=BARRIER_TIMEOUT_S),
    )
    try:
        times, reduce, cpu = [], [], []
        for i in range(cfg["warmup"] + cfg["repeats"]):
            vector.copy_(own0)
            barrier.wait(BARRIER_TIMEOUT_S)
            t0, c0 = time.perf_counter(), time.process_time()
            dist.all_reduce(vector, op=dist.ReduceOp.SUM)
            t1 = time.perf_counter()
            vector.div_(2)
            t2, c2 = time.perf_counter(), time.process_time()
            if i >= cfg["warmup"]:
                times.append(t2 - t0)
                reduce.append(t1 - t0)
                cpu.append(c2 - c0)
        checks = _verify(vector, expected)
        barrier.wait(BARRIER_TIMEOUT_S)
        return {"times": times, "split": {"all_reduce": reduce, "cpu": cpu}, **checks}
    finally:
        dist.destroy_process_group()


def _worker(method: str, rank: int, cfg: dict, barrier, results, conn) -> None:
    """Entry point of a spawned process: report a result dict or the error."""
    if method.startswith("peerd"):
        cfg = {**cfg, "bulk": method != "peerd-grpc", "auth": method == "peerd-auth",
               "hand_over": method != "peerd-copy", "pair": method != "peerd-flat"}
    run = {"peerd": _peerd, "peerd-flat": _peerd, "peerd-grpc": _peerd, "peerd-auth": _peerd, "peerd-copy": _peerd,
           "tcp": _tcp, "gloo": _gloo}[method]
    rank_entry(lambda: run(rank, cfg, barrier, conn), rank, barrier, results, conn)


# ---------------------------------------------------------------- parent side


def run_method(method: str, cfg: dict) -> dict:
    """Spawn the two processes of one method, collect their timings, always reap them."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    ends = ctx.Pipe(duplex=True)
    procs = [
        ctx.Process(target=_worker, args=(method, r, cfg, barrier, results, ends[r]),
                    name=f"bench-{method}-{r}", daemon=True)
        for r in (0, 1)
    ]
    try:
        for p in procs:
            p.start()
        got = collect(method, procs, results, time.monotonic() + cfg["method_timeout_s"])
    finally:
        reap(procs, ends, results)
    a, b = got[0], got[1]
    if a["checksum"] != b["checksum"] or a["head"] != b["head"]:
        raise AssertionError(f"{method}: the two processes hold different averages")
    return {
        "source": a.get("source"),
        "times": [max(x, y) for x, y in zip(a["times"], b["times"])],
        "per_rank": [a["times"], b["times"]],
        # sub-steps: per repeat the slower process's figure, each taken on its own
        "split": {k: [max(x, y) for x, y in zip(v, b["split"][k])] for k, v in a.get("split", {}).items()},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/exchange.py",
        description="Time the exchange-and-average of an fp32 vector between 2 processes on 127.0.0.1: "
        "peerd's gRPC segment gossip vs a raw TCP socket vs torch.distributed gloo all_reduce.",
        epilog="Figures are per repeat the slower of the two processes, in ms; ratios are of medians.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mib", type=float, default=64, help="vector size in MiB (fp32: 262144 floats per MiB)")
    p.add_argument("--repeats", type=int, default=10, help="timed repeats per method")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up repeats per method")
    p.add_argument("--segments", type=int, default=8, help="peerd segments (job default: 8)")
    p.add_argument("--chunk-kib", type=int, default=1024, help="peerd streamed chunk size in KiB (job default: 1024)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--deadline-s", type=float, default=60.0, help="peerd gossip deadline per round")
    p.add_argument("--no-uvloop", action="store_true", help="run peerd on asyncio's loop even if uvloop is installed "
                   "(the real worker uses uvloop when it can)")
    p.add_argument("--profile", metavar="DIR", help="cProfile the timed peerd repeats (slows them down); writes DIR/peerd-rank{0,1}.pstats, "
                   "read with python -m pstats")
    p.add_argument("--json", metavar="OUT", help="also write the raw timings and settings to this file")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        p.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    if args.repeats < 1 or args.warmup < 0 or args.segments < 1 or args.chunk_kib < 1 or args.mib <= 0:
        p.error("--repeats, --segments, --chunk-kib and --mib must be positive, --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    numel = int(args.mib * 1024 * 1024) // 4
    if numel < args.segments:
        raise SystemExit("vector smaller than the segment count")
    uvloop = False
    if not args.no_uvloop:
        try:
            import uvloop as _  # noqa: F401

            uvloop = True
        except ImportError:
            pass
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    import grpc
    import torch

    with tempfile.TemporaryDirectory(prefix="peerd-bench-") as tmp:
        cfg = {
            "numel": numel, "repeats": args.repeats, "warmup": args.warmup, "segments": args.segments,
            "chunk_kib": args.chunk_kib, "deadline_s": args.deadline_s, "uvloop": uvloop,
            "profile": os.path.abspath(args.profile) if args.profile else None,
            "gloo_store": os.path.join(tmp, "gloo-store"),
            "method_timeout_s": 60.0 + args.repeats * 30.0,
        }
        print(f"{numel * 4 / 2**20:g} MiB fp32 ({numel} floats), 2 processes on 127.0.0.1, "
              f"{args.repeats} repeats + {args.warmup} warm-up; peerd: {args.segments} segments, "
              f"{args.chunk_kib} KiB chunks, {'uvloop' if uvloop else 'asyncio'}; "
              f"torch {torch.__version__}, grpcio {grpc.__version__}, {os.cpu_count()} CPUs", flush=True)
        runs = {}
        for method in args.methods:
            t = time.monotonic()
            runs[method] = run_method(method, cfg)
            source = f" (peerd from {runs[method]['source']})" if runs[method]["source"] else ""
            print(f"  {method}: done in {time.monotonic() - t:.1f} s, average verified{source}", flush=True)

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
    if "peerd" in med and "gloo" in med:
        print(f"peerd/gloo = {med['peerd'] / med['gloo']:.2f}")
    if "peerd" in med and "tcp" in med:
        print(f"peerd/tcp  = {med['peerd'] / med['tcp']:.2f}")
    if "peerd" in med and "peerd-auth" in med:
        print(f"peerd-auth/peerd = {med['peerd-auth'] / med['peerd']:.2f}")

    if args.json:
        report = {
            "settings": {k: v for k, v in cfg.items() if k not in ("gloo_store", "profile")}
            | {"mib": numel * 4 / 2**20, "torch": torch.__version__, "grpcio": grpc.__version__,
               "cpus": os.cpu_count(), "python": platform.python_version()},
            "ms": {m: {"median": med[m] * 1e3, "p90": quantile(r["times"], 0.9) * 1e3,
                       "times": [t * 1e3 for t in r["times"]],
                       "per_rank": [[t * 1e3 for t in ts] for ts in r["per_rank"]],
                       "split": {k: [t * 1e3 for t in v] for k, v in r["split"].items()}}
                   for m, r in runs.items()},
            "ratios": {k: med["peerd"] / med[d] for k, d in (("peerd/gloo", "gloo"), ("peerd/tcp", "tcp"))
                       if "peerd" in med and d in med},
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main, after=stop_resource_tracker)
