"""Ranks on capped links instead of loopback: a bridge and one network namespace
per rank (peerd.soak.netns: veth pairs, a tc tbf cap both ways), the bytes each
rank's link carried, and a rank's way into its namespace."""

from __future__ import annotations

import ctypes
import math
import os
import secrets
import statistics
import sys

from harness.output import md_table
from peerd.soak.netns import Namespaces, namespaces_unavailable

CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns is Python 3.12+


def enter_namespace(name: str) -> None:
    """Move the calling thread into the network namespace `name` (made by `ip
    netns add`). Call it first thing in a rank's main thread: the sockets it opens
    and the threads it starts afterwards (gRPC's, asyncio's) are made there too."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


class CappedLinks:
    """`n` ranks, each in a namespace of its own on one bridge; cap() shapes every
    rank's link both ways. A context manager: leaving removes every namespace it
    made (on errors and Ctrl+C too)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.net = Namespaces(secrets.token_hex(2))

    def __enter__(self) -> CappedLinks:
        if why := namespaces_unavailable():
            raise SystemExit(f"capped links need network namespaces: {why}")
        try:
            self.net.open()
            for rank in range(self.n):
                self.net.add_peer(rank, 0.0)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        errors = self.net.close()
        if errors:
            print("teardown: " + "; ".join(errors), file=sys.stderr)

    @property
    def namespaces(self) -> list[str]:
        return [self.net.peers[r].namespace for r in range(self.n)]

    @property
    def addresses(self) -> list[str]:
        return [self.net.peers[r].address for r in range(self.n)]

    def cap(self, mbit: float) -> None:
        for rank in range(self.n):
            self.net.shape(rank, mbit, both_ways=True)

    def counters(self) -> list[tuple[int, int]]:
        """Per rank (bytes sent, bytes received) so far, counted at its bridge port
        (every header in: TCP, TLS, gRPC)."""
        got = self.net.counters()
        return [got.get(r, (0, 0)) for r in range(self.n)]


def counted(links: CappedLinks, rounds: int, run):
    """run()'s result dict with "bytes": per rank (sent, received) per round, from
    the bridge's counters around it (the connection's set-up spread over `rounds`)."""
    before = links.counters()
    result = run()
    after = links.counters()
    result["bytes"] = [((a[0] - b[0]) / rounds, (a[1] - b[1]) / rounds) for a, b in zip(after, before)]
    return result


def link_seconds(nbytes: float, mbit: float) -> float:
    return nbytes * 8 / (mbit * 1e6)


def link_table(runs: dict[str, dict], mbit: float, baseline: str = "peerd") -> str:
    """Per method at one cap: wall time per round (median, min–max), CPU per
    process and the time its threads waited for a CPU, summed (medians, the
    slower process), the ratios to `baseline`, the bytes per round and the link's
    own time for them (the busier direction of the busier rank ÷ the rate)."""
    med = {m: statistics.median(r["times"]) for m, r in runs.items()}
    cpu = {m: statistics.median(r["split"]["cpu"]) for m, r in runs.items()}
    waited = {m: statistics.median(r["split"].get("cpu_wait") or [math.nan]) for m, r in runs.items()}
    rows = []
    for m, r in runs.items():
        wire = max(max(sent, received) for sent, received in r["bytes"])
        floor = link_seconds(wire, mbit)
        ratio = (f"{med[m] / med[baseline]:.2f}", f"{cpu[m] / cpu[baseline]:.2f}") if baseline in runs else ("-", "-")
        rows.append([m, f"{med[m] * 1e3:.0f}", f"{min(r['times']) * 1e3:.0f}–{max(r['times']) * 1e3:.0f}",
                     f"{cpu[m] * 1e3:.0f}", f"{waited[m] * 1e3:.0f}", *ratio, f"{wire / 1e6:.1f}", f"{floor * 1e3:.0f}",
                     f"{med[m] / floor:.2f}"])
    return md_table(["method", "wall ms (median)", "min–max", "CPU ms per process", "waits for a CPU ms (all threads)",
                     f"× {baseline} wall",
                     f"× {baseline} CPU", "MB per round, busier way", "link floor ms", "× floor"], rows)
