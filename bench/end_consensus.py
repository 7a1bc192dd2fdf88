#!/usr/bin/env python
"""The end consensus at lab scale: every member's traffic and the time to
one model, by parts against pulling every member's whole final model.

  parts   peerd.worker.state.endparts.end_consensus, what a finished worker
          runs: each member averages one part of the final vector over the set
          (stage 4 in, stage 5 out) and pulls every other part's average.
  whole   publish, then peerd.worker.state.consensus.average_models: every
          member pulls every other member's whole final model (stage 3) and
          averages them all (the way by parts falls back to this).

For each method and member count N, a fresh child process runs N members in
one event loop, each with its own exchange server (gRPC and bulk lane) on
127.0.0.1 and its own transport, its bytes counted as the worker counts them
(peerd.worker.wire.traffic); all start together. Figures:

- the bytes each member took in and sent out (the largest over members, in
  model sizes);
- the end time: from the start until the last member held the average. The
  members share the child's cores, so it counts every member's arithmetic one
  after the other, where separate machines run it at once;
- the CPU time the child spent meanwhile (all members, every thread): on a
  shared machine the steadier figure;
- the memory the consensus added: the child's peak RSS over its RSS at the
  start, in model sizes per member (the N final models were made before).

Every member must end with the same bits, and both methods with the same bits
for the same N. A method whose estimated memory does not fit the machine
(whole: about N + 1 models per member at once) is not run and says so.

    .venv/bin/python bench/end_consensus.py                          # 4, 8, 16 members, 30M parameters
    .venv/bin/python bench/end_consensus.py --members 4 --params 1000000
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import resource
import subprocess
import sys
import time

from harness.output import md_table
from harness.script import arg_parser, names, numbers, run_main

METHODS = ("parts", "whole")
CHUNK_ELEMS = 262_144  # the job default, chunk_kib = 1024
SEGMENTS = 8  # the job default gossip.segments: stage 3's layout


class _Member:
    """A finished worker's exchange side, wired as the engine wires it."""

    def __init__(self, me: str, values) -> None:
        from peerd.core.segments import split_even
        from peerd.worker.state.endparts import FinalVector
        from peerd.worker.wire.stores import FinalStore, Identity, SegmentServer, SnapshotStore
        from peerd.worker.wire.traffic import CountingSegmentServer, Traffic

        self.me, self.identity = me, Identity("bench-end", "fp", me)
        self.own = FinalVector(values, split_even(values.numel(), SEGMENTS))
        self.final, self.traffic = FinalStore(), Traffic()
        self.store = SnapshotStore(values.numel())  # untouched: no round is served
        server = SegmentServer(self.identity, self.store, SEGMENTS, CHUNK_ELEMS, final=self.final)
        self.server = CountingSegmentServer(server, self.traffic)
        self.seconds = 0.0

    async def conclude(self, method: str, addresses: dict[str, str], transport, timeout: float):
        from peerd.worker.state.consensus import Models, average_models
        from peerd.worker.state.endparts import end_consensus

        started = time.monotonic()
        if method == "parts":
            c = await end_consensus(self.me, self.own, self.final, addresses, transport, timeout)
        else:
            await self.final.publish(self.own.values, self.own.layout)
            c = await average_models(self.me, self.own.values, addresses, self.own.layout, transport, timeout,
                                     Models())
        self.seconds = time.monotonic() - started
        return c


async def _run(method: str, n: int, numel: int, timeout: float) -> dict:
    """N members in this loop: their figures, and the digest they agree on."""
    import torch

    from peerd.worker.state.pull import StateBoard, StateServer
    from peerd.worker.wire.server import start_exchange_server
    from peerd.worker.wire.traffic import CountingTransport
    from peerd.worker.wire.transport import GrpcTransport

    members = [_Member(f"p{k:02d}", torch.randn(numel, generator=torch.Generator().manual_seed(k))) for k in range(n)]
    servers, addresses, transports = [], {}, {}
    try:
        for m in members:
            state = StateServer(m.identity, StateBoard(1, 1), m.store, CHUNK_ELEMS)
            server, addresses[m.me] = await start_exchange_server(m.server, state, "127.0.0.1")
            servers.append(server)
            transports[m.me] = CountingTransport(GrpcTransport(m.identity), m.traffic)
        before = _rss_bytes()
        started, cpu = time.monotonic(), time.process_time()
        results = await asyncio.gather(*(m.conclude(method, addresses, transports[m.me], timeout) for m in members))
        wall, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        for t in transports.values():
            await t.aclose()
        for s in servers:
            await s.stop(grace=None)
    digests = {hashlib.sha256(c.vector.numpy().tobytes()).hexdigest() for c in results}
    if len(digests) != 1 or any(c.plan.size != n for c in results):
        why = sorted({f"{p}: {w}" for c in results for p, w in c.left_out.items()})
        raise RuntimeError(f"{method}, {n} members: not one average over all ({len(digests)} digests): {why[:8]}")
    model = 4 * numel
    return {"method": method, "members": n, "numel": numel, "seconds": wall, "cpu_s": cpu,
            "slowest_member_s": max(m.seconds for m in members),
            "in_models": max(m.traffic.received for m in members) / model,
            "out_models": max(m.traffic.sent for m in members) / model,
            "added_rss_models_per_member": (_peak_rss_bytes() - before) / model / n,
            "how": sorted({c.how for c in results}), "digest": digests.pop()[:16]}


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(spec: str) -> None:
    """One method at one N, in this (fresh) process: its figures as JSON on stdout."""
    import torch

    cfg = json.loads(spec)
    torch.set_num_threads(1)
    print(json.dumps(asyncio.run(_run(cfg["method"], cfg["members"], cfg["numel"], cfg["timeout_s"]))), flush=True)


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def _needed_bytes(method: str, n: int, numel: int) -> int:
    """Peak estimate: own + average + the others' (whole) or their parts (parts), per member, and 1 GiB."""
    per_member = (n + 1 if method == "whole" else 3) * 4 * numel
    return n * per_member + (1 << 30)


def _measure(method: str, n: int, args) -> dict:
    need = _needed_bytes(method, n, args.params)
    if need > 0.8 * _available_bytes():
        return {"method": method, "members": n, "skipped": f"needs about {need / 2**30:.0f} GiB, "
                f"{_available_bytes() / 2**30:.0f} GiB available"}
    spec = json.dumps({"method": method, "members": n, "numel": args.params, "timeout_s": args.timeout_s})
    done = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True,
                          timeout=args.timeout_s + 120)
    if done.returncode != 0:
        raise RuntimeError(f"{method}, {n} members failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: list[dict]) -> str:
    rows = []
    for r in results:
        base = next((b for b in results if b["members"] == r["members"] and b["method"] == "whole"
                     and "skipped" not in b), None)
        if "skipped" in r:
            rows.append([r["members"], r["method"], "not run: " + r["skipped"], "", "", "", "", ""])
            continue
        ratio = lambda key, fmt: f"{r[key]:{fmt}}" + (f" ({r[key] / base[key]:.2f}×)" if base else "")
        rows.append([r["members"], r["method"], ratio("in_models", ".2f"), ratio("out_models", ".2f"),
                     ratio("seconds", ".2f"), ratio("cpu_s", ".2f"), f"{r['added_rss_models_per_member']:.1f}",
                     r["digest"]])
    return md_table(["members", "method", "in per member (models)", "out per member (models)", "end time (s)",
                     "CPU, all members (s)", "memory added per member (models)", "digest"], rows)


def parse_args(argv: list[str] | None = None):
    p = arg_parser(__doc__, defaults=True, prog="bench/end_consensus.py")
    p.add_argument("--members", default="4,8,16", help="comma-separated member counts")
    p.add_argument("--params", type=int, default=30_000_000, help="fp32 values in the final model")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--timeout-s", type=float, default=300.0, help="one try's deadline, and each run's bound")
    args = p.parse_args(argv)
    args.methods = names(p, args.methods, METHODS, "--methods")
    args.members = numbers(p, args.members, int, "--members")
    if any(n < 2 for n in args.members) or args.params < 1:
        p.error("--members ≥ 2, --params ≥ 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for n in args.members:
        for method in args.methods:
            results.append(_measure(method, n, args))
            print(f"  {method}, {n} members: {json.dumps(results[-1])}", flush=True)
    print(_table(results))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        run_main(main)
