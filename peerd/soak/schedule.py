"""Churn schedules: a list of events at times from the start of training.

Made from a seed (`seeded`) or read from a TOML or JSON file (`load_schedule`).
Pure: no I/O beyond reading the file, no clock; the runner carries events out.
"""

from __future__ import annotations

import json
import random
import tomllib
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import ConfigError

KILL_WORKER = "kill_worker"  # kill -9 the peer's worker; its daemon restarts it
KILL_DAEMON = "kill_daemon"  # kill -9 the daemon (its worker follows), restart it after down_s
PARTITION = "partition"  # the peer's link down for down_s, then up again
LEAVE = "leave"  # peerctl leave --drain
JOIN = "join"  # a new peer (or one that left) joins the running job
SLOWDOWN = "slowdown"  # the peer's compute slowdown becomes `factor` (daemon restarted with it)
OWNER = "owner"  # the machine's owner comes for down_s: peerctl pause --for down_s; back by itself
FREEZE = "freeze"  # SIGSTOP the peer's daemon or its worker (`process`) for down_s, then SIGCONT
KINDS = (KILL_WORKER, KILL_DAEMON, PARTITION, LEAVE, JOIN, SLOWDOWN, OWNER, FREEZE)
SEEDED_KINDS = tuple(k for k in KINDS if k != FREEZE)  # a seeded schedule's unless told (--kinds)
FREEZE_PROCESSES = ("daemon", "worker")
# Events after which the peer's worker trains again (started anew, or continued) and
# must catch up with the job's state.
RESTARTS = (KILL_WORKER, KILL_DAEMON, JOIN, SLOWDOWN, OWNER, FREEZE)
OUTAGES = (KILL_DAEMON, PARTITION, OWNER, FREEZE)  # events that last down_s


@dataclass(frozen=True)
class Event:
    at_s: float
    kind: str
    peer: int = -1  # peer index (peer-N); -1 for a join: a new peer
    down_s: float = 0.0  # kill_daemon, partition, owner, freeze: how long the peer stays down
    factor: float = 1.0  # slowdown
    process: str = ""  # freeze: "daemon" or "worker"

    def describe(self) -> str:
        who = f"peer-{self.peer}" if self.peer >= 0 else "a new peer"
        extra = f" {self.process}" if self.kind == FREEZE else ""
        extra += f" for {self.down_s:g}s" if self.kind in OUTAGES else ""
        extra += f" to {self.factor:g}×" if self.kind == SLOWDOWN else ""
        return f"{self.kind} {who}{extra}"


def seeded(seed: int, peers: int, duration_s: float, interval_s: float, settle_s: float,
           kinds: tuple[str, ...] = SEEDED_KINDS, down_s: float = 10.0) -> list[Event]:
    """One event every `interval_s` until `duration_s - settle_s`, kinds taken
    in shuffled rounds so that each appears; never fewer than max(2, peers // 2)
    peers stay in the job, a peer that left is the first to join again, and the
    target of an event is not one of the two before it when another can be chosen."""
    _check_kinds(kinds, "kinds")
    rng = random.Random(seed)
    members, left, next_new = list(range(peers)), [], peers
    events: list[Event] = []
    bag: list[str] = []
    t = interval_s
    while t <= duration_s - settle_s:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        if kind == LEAVE and len(members) <= max(2, peers // 2):
            kind = KILL_WORKER
        if kind == JOIN:
            peer = left.pop(0) if left else next_new
            next_new += peer == next_new
            members.append(peer)
            events.append(Event(t, JOIN, peer))
        else:  # not one of the last two targets when others remain: each event judged alone
            recent = {e.peer for e in events[-2:]}
            peer = rng.choice([m for m in members if m not in recent] or members)
            if kind == LEAVE:
                members.remove(peer)
                left.append(peer)
            events.append(Event(t, kind, peer, down_s if kind in OUTAGES else 0.0,
                                rng.choice((1.0, 1.5, 2.0, 3.0)) if kind == SLOWDOWN else 1.0,
                                rng.choice(FREEZE_PROCESSES) if kind == FREEZE else ""))
        t += interval_s
    return events


def load_schedule(path: Path) -> list[Event]:
    """Events from a TOML file ([[event]] tables) or a JSON file ({"events": [...]})."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read schedule {path}: {exc.strerror}") from None
    return parse_schedule(text, str(path), json_format=path.suffix == ".json")


def parse_schedule(text: str, source: str, json_format: bool = False) -> list[Event]:
    try:
        data = json.loads(text) if json_format else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{source}: not valid {'JSON' if json_format else 'TOML'}: {exc}") from None
    key = "events" if json_format else "event"
    if not isinstance(data, dict) or set(data) - {key}:
        raise ConfigError(f"{source}: expected only a list of events under {key!r}")
    items = data.get(key, [])
    if not isinstance(items, list):
        raise ConfigError(f"{source}: {key!r} must be a list of tables")
    events = [_event(item, f"{source}: event {i + 1}") for i, item in enumerate(items)]
    return sorted(events, key=lambda e: e.at_s)


def _event(item: object, where: str) -> Event:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = set(item) - {"at", "kind", "peer", "down_s", "factor", "process"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
                          "(known: at, kind, peer, down_s, factor, process)")
    kind = item.get("kind")
    _check_kinds((kind,), f"{where}: kind")
    at = _number(item, "at", where, None, lambda v: v >= 0, "seconds ≥ 0 from the start of training")
    peer = item.get("peer", -1 if kind == JOIN else None)
    if isinstance(peer, bool) or not isinstance(peer, int) or peer < (-1 if kind == JOIN else 0):
        raise ConfigError(f"{where}: peer must be a peer index ≥ 0" + (" (or omitted: a new peer)" if kind == JOIN else ""))
    down = _number(item, "down_s", where, 10.0 if kind in OUTAGES else 0.0,
                   lambda v: v >= 0, "seconds ≥ 0")
    factor = _number(item, "factor", where, 1.0 if kind != SLOWDOWN else None, lambda v: v >= 1, "a factor ≥ 1")
    return Event(float(at), kind, peer, float(down), float(factor), _process(item, kind, where))


def _process(item: dict, kind: str, where: str) -> str:
    """Which of the peer's processes a freeze stops; no other kind takes one."""
    process = item.get("process")
    if kind != FREEZE:
        if process is not None:
            raise ConfigError(f"{where}: process is for a freeze only, not for {kind}")
        return ""
    expect = " or ".join(FREEZE_PROCESSES)
    if process is None:
        raise ConfigError(f"{where}: process is required for a freeze ({expect}: the peer's process to stop)")
    if process not in FREEZE_PROCESSES:
        raise ConfigError(f"{where}: process = {process!r}: expected {expect}")
    return process


def kinds_from(text: str) -> tuple[str, ...]:
    """Event kinds from a comma-separated list (the soak's --kinds), each known."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds:
        raise ConfigError(f"--kinds {text!r}: name at least one event kind (of {', '.join(KINDS)})")
    _check_kinds(kinds, "--kinds")
    return kinds


def _number(item: dict, key: str, where: str, default, check, expect: str) -> float:
    value = item.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key} is required ({expect})")
    if isinstance(value, bool) or not isinstance(value, int | float) or not check(value):
        raise ConfigError(f"{where}: {key} = {value!r}: expected {expect}")
    return value


def _check_kinds(kinds, where: str) -> None:
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(f"{where}: unknown event kind {kind!r} (one of {', '.join(KINDS)})")
