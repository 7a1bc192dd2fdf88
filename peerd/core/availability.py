"""Whether a shared machine may train now (docs/operations.md, "Shared
machines"): its owner comes first. Pure: the daemon's shell
(peerd.daemon.availability) samples the GPU or /proc and the clocks and
carries out what `decide` says.

The order of the reasons not to train is the order an owner asks about them:
their own pause, the machine's windows, their processes, the hold-off after
those ended.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from peerd.core.windows import Window, clock_text, in_windows, next_start

ALWAYS, WHEN_FREE = "always", "when-free"
MODES = (ALWAYS, WHEN_FREE)
FOREVER = datetime.max  # a pause with no end: until `peerctl resume`
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)?", re.IGNORECASE)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}
# A process started as one of these is a peerd process, of this daemon or another
# (one daemon per GPU): never the owner's.
PEERD_MODULES = ("peerd.worker", "peerd.cli.")
PEERD_PROGRAMS = ("peerd", "peerctl")


@dataclass(frozen=True)
class Settings:
    """`[availability]`: see docs/operations.md for each key."""

    mode: str = ALWAYS
    windows: tuple[Window, ...] = ()
    cpu_share: float = 0.5  # of one core: a process using more is the owner's work
    hold_off_s: float = 120.0  # free this long before training again
    check_interval_s: float = 1.0
    commands: tuple[str, ...] = ()  # only processes of these names count; (): any


@dataclass(frozen=True)
class Use:
    """One process that is not peerd's: its CPU use over the last check, or the GPU it holds."""

    pid: int
    name: str
    cores: float = 0.0
    gpu: int | None = None  # the index of a GPU it runs on (NVML), None: CPU only
    gpu_bytes: int = 0


@dataclass(frozen=True)
class Verdict:
    train: bool
    reason: str = ""  # why not: "paused by owner until 18:00", "busy: ...", "outside its windows until 22:00"
    owner_busy: bool = False  # the owner's processes (not a pause or a window) keep it from training


@dataclass(frozen=True)
class Gate:
    """What `decide` remembers from one check to the next: since when (monotonic
    seconds) the owner's processes have been quiet; None: busy or not known yet."""

    free_since: float | None = None


def busy_reason(uses: Iterable[Use], cpu_share: float, commands: Sequence[str] = ()) -> str:
    """Why the machine is busy with its owner's work, or "" when it is free: a
    process on a GPU, else the process using the most CPU, above `cpu_share` cores."""
    uses = [u for u in uses if not commands or u.name in commands]
    on_gpu = sorted((u for u in uses if u.gpu is not None), key=lambda u: (-u.gpu_bytes, u.pid))
    if on_gpu:
        u = on_gpu[0]
        return f"busy: pid {u.pid} {u.name} holds GPU {u.gpu}" + (
            f" ({u.gpu_bytes / 2**30:.1f} GiB)" if u.gpu_bytes else "")
    heavy = max((u for u in uses if u.cores > cpu_share), key=lambda u: u.cores, default=None)
    if heavy is None:
        return ""
    return f"busy: pid {heavy.pid} {heavy.name} uses {heavy.cores:.1f} cores"


def decide(settings: Settings, gate: Gate, now_s: float, local: datetime, paused_until: datetime | None,
           busy: str | None) -> tuple[Gate, Verdict]:
    """Train now or not, and the gate for the next check. `now_s`: a monotonic
    clock; `local`: the machine's local time; `paused_until`: the owner's pause
    (FOREVER: until resumed; None: none); `busy`: busy_reason of this check, None
    when it was not sampled (mode "always", or no earlier sample to compare)."""
    if busy is None or busy:
        gate = Gate(None)
    elif gate.free_since is None:
        gate = Gate(now_s)
    if paused_until is not None and local < paused_until:
        until = "" if paused_until == FOREVER else f" until {clock_text(paused_until, local)}"
        return gate, Verdict(False, f"paused by owner{until}")
    if not in_windows(settings.windows, local):
        opens = next_start(settings.windows, local)
        return gate, Verdict(False, f"outside its windows until {clock_text(opens, local)}")
    if settings.mode == ALWAYS:
        return gate, Verdict(True)
    if busy:
        return gate, Verdict(False, busy, owner_busy=True)
    if gate.free_since is None:
        return gate, Verdict(False, "waiting for the first sample of the machine's use", owner_busy=True)
    free_s = now_s - gate.free_since
    if free_s < settings.hold_off_s:
        return gate, Verdict(False, f"free for {free_s:.0f}s of the {settings.hold_off_s:g}s hold-off",
                             owner_busy=True)
    return gate, Verdict(True)


def parse_duration(text: str) -> float:
    """Seconds in "20s", "90m", "1h30m", "2d", "45" (seconds); ValueError otherwise."""
    text = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower() or None]
        pos = match.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(f"{text!r} is not a duration: e.g. 20s, 90m, 1h30m, 2d")
    return total


# ---- which processes are peerd's own -----------------------------------------------


def is_peerd(argv: Sequence[str]) -> bool:
    """A peerd daemon, worker or command, by its command line."""
    if not argv:
        return False
    if argv[0].rsplit("/", 1)[-1] in PEERD_PROGRAMS:
        return True
    return any(a == "-m" and b.startswith(PEERD_MODULES) for a, b in zip(argv, argv[1:]))


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """The roots and every process below them, from pid -> parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


@dataclass(frozen=True)
class Proc:
    """One process in a /proc snapshot."""

    ppid: int
    start_ticks: int  # since boot: with the pid, who it is (pids are reused)
    cpu_ticks: int  # user + system time so far
    name: str
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    uptime_s: float
    procs: Mapping[int, Proc]


def cpu_uses(before: Snapshot, after: Snapshot, hz: float, own: Iterable[int] = ()) -> list[Use]:
    """Each process's CPU use between two snapshots, in cores, but for peerd's
    own (`own` and every peerd command) and their children. A process that
    started since `before` counts all its time; one seen in neither whole is left out."""
    dt = after.uptime_s - before.uptime_s
    if dt <= 0:
        return []
    roots = {*own, *(pid for pid, p in after.procs.items() if is_peerd(p.argv))}
    peerd = descendants({pid: p.ppid for pid, p in after.procs.items()}, roots)
    uses = []
    for pid, p in after.procs.items():
        if pid in peerd:
            continue
        old = before.procs.get(pid)
        if old is not None and old.start_ticks == p.start_ticks:
            ticks = p.cpu_ticks - old.cpu_ticks
        elif p.start_ticks / hz >= before.uptime_s:
            ticks = p.cpu_ticks  # started since the last look: all of its time is new
        else:
            continue
        uses.append(Use(pid, p.name, cores=max(0, ticks) / hz / dt))
    return uses


def gpu_uses(held: Iterable[tuple[int, int, int]], names: Mapping[int, str], parents: Mapping[int, int],
             argvs: Mapping[int, Sequence[str]], own: Iterable[int] = ()) -> list[Use]:
    """(pid, GPU index, bytes) of the processes NVML lists, less peerd's own and
    their children; names from /proc where it shows them."""
    roots = {*own, *(pid for pid, argv in argvs.items() if is_peerd(argv))}
    peerd = descendants(parents, roots)
    return [Use(pid, names.get(pid, "?"), gpu=index, gpu_bytes=size)
            for pid, index, size in held if pid not in peerd]
