"""The soak's checks: pure functions of what the runner sampled and did.

Each takes the samples (one per peer per poll) and the events carried out, and
returns a `Check` with a verdict and the evidence for it. No I/O, no clock.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from peerd.cli.plot import metric_label
from peerd.core.codes import WorkerState
from peerd.soak.schedule import PARTITION, RESTARTS

PASS, FAIL, SKIP = "pass", "fail", "skip"
# The target when none is given, by metric; a metric not here has none (the check only reports).
DEFAULT_TARGETS = {"accuracy": 0.9}


@dataclass(frozen=True)
class Sample:
    """One peer at one poll: the harness's truth (expected_up, linked, in_job,
    frozen) and what the peer's daemon answered."""

    t: float
    peer: str
    expected_up: bool  # the harness has not killed this daemon
    up: bool  # its process is alive
    linked: bool  # its link is up
    in_job: bool  # the harness joined it and it has not left
    frozen: bool = False  # the harness has stopped its daemon or worker (SIGSTOP) for a freeze
    state: str = "down"  # job state on this daemon ("" when it does not run the job)
    phase: str = ""
    step: int = 0
    round: int = 0
    loss: float = math.nan
    metric: float = math.nan  # the job's metric (job.metric) at its last evaluation
    lr: float = math.nan
    batch: int = 0
    exchange_s: float = math.nan
    misses: int = 0
    reached: int = 0
    planned: int = 0
    restarts: int = 0
    view: frozenset[str] = frozenset()  # peers this daemon sees in the job, itself included
    tx_bytes: float = math.nan
    rx_bytes: float = math.nan

    @property
    def training(self) -> bool:
        return self.up and self.state == WorkerState.RUNNING and self.phase == "training"


@dataclass(frozen=True)
class EventRecord:
    """An event as carried out: `done_s` is when its last action ended (the restart, the heal)."""

    at_s: float
    done_s: float
    kind: str
    peer: str
    detail: str = ""
    ok: bool = True


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    evidence: str
    details: tuple[str, ...] = field(default=())


def _by_peer(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.peer, []).append(s)
    return out


def _by_time(samples: list[Sample]) -> list[tuple[float, list[Sample]]]:
    out: dict[float, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.t, []).append(s)
    return sorted(out.items())


def daemons_alive(samples: list[Sample]) -> Check:
    """No daemon died except those the harness killed."""
    deaths = {}
    for s in samples:
        if s.expected_up and not s.up and s.peer not in deaths:
            deaths[s.peer] = s.t
    name = "no daemon died unless killed on purpose"
    peers = len({s.peer for s in samples})
    if deaths:
        return Check(name, FAIL, f"{len(deaths)} daemon(s) died on their own",
                     tuple(f"{p} found dead at {t:.0f}s" for p, t in sorted(deaths.items())))
    return Check(name, PASS, f"all {peers} daemons alive whenever not killed on purpose "
                             f"({len(samples)} samples)")


def rounds_within_deadline(samples: list[Sample], ceiling_s: float, stall_s: float) -> Check:
    """No exchange took longer than the job's deadline ceiling (plus 1 s of slack),
    and no connected, training peer's round stood still for longer than `stall_s`
    (a frozen peer's stands still on purpose: not judged while frozen)."""
    name = "no round blocked past its deadline"
    limit = ceiling_s + 1.0
    late = [s for s in samples if not math.isnan(s.exchange_s) and s.exchange_s > limit]
    exchanges = [s.exchange_s for s in samples if not math.isnan(s.exchange_s)]
    stalls = []
    for peer, rows in _by_peer(samples).items():
        since = last = None
        for s in [*rows, None]:  # None flushes the last stretch
            judged = s is not None and s.training and s.linked and s.in_job and not s.frozen
            if not judged or since is None or s.round != since.round:
                if since is not None and last.t - since.t > stall_s:
                    stalls.append(f"{peer}: round {since.round} stood still from {since.t:.0f}s to {last.t:.0f}s")
                since = s if judged else None
            last = s
    worst = max(exchanges, default=math.nan)
    evidence = (f"longest sampled exchange {worst:.2f}s (limit {limit:.1f}s) over {len(exchanges)} samples; "
                f"{len(stalls)} stall(s) over {stall_s:.0f}s")
    details = tuple(f"{s.peer} at {s.t:.0f}s: exchange {s.exchange_s:.2f}s" for s in late[:20]) + tuple(stalls[:20])
    if not exchanges:
        return Check(name, FAIL, "no exchange was ever sampled")
    return Check(name, FAIL if late or stalls else PASS, evidence, details)


def _loss_level(rows: list[Sample], t0: float, t1: float, exclude: str) -> float:
    losses = [s.loss for s in rows if t0 <= s.t <= t1 and s.peer != exclude and s.training and not math.isnan(s.loss)]
    return statistics.median(losses) if losses else math.nan


def restarted_resumed(samples: list[Sample], events: list[EventRecord], round_slack: int = 20,
                      loss_ratio: float = 1.5, loss_slack: float = 0.05) -> Check:
    """Each peer whose worker started again (kill, restart, join, slowdown change)
    trained again from the job's round, not from scratch, and got its loss down
    to the others' (≤ ratio × their median + slack) before the end."""
    name = "every restarted peer resumed and reached the others' loss"
    peers = _by_peer(samples)
    subjects = [e for e in events if e.kind in RESTARTS and e.ok]
    if not subjects:
        return Check(name, SKIP, "no event restarted a worker")
    failures, notes = [], []
    for e in subjects:
        rows = [s for s in peers.get(e.peer, []) if s.t >= e.done_s]
        back = next((s for s in rows if s.training and s.step > 0), None)
        cut = min((x.at_s for x in events if x.peer == e.peer and x.at_s > e.done_s), default=math.inf)
        if back is None or back.t > cut:
            if cut < math.inf:  # e.g. cut off by a partition while still starting: judged by that event
                notes.append(f"{e.kind} {e.peer} at {e.at_s:.0f}s: not judged, the next event on it came "
                             f"{cut - e.done_s:.0f}s later, before it trained again")
            else:
                failures.append(f"{e.kind} {e.peer} at {e.at_s:.0f}s: never trained again")
            continue
        others = [s.round for s in samples if s.t == back.t and s.peer != e.peer and s.training]
        floor = statistics.median(others) - round_slack if others else 0
        if back.round < floor:
            failures.append(f"{e.kind} {e.peer}: back at round {back.round}, the others' median "
                            f"{floor + round_slack:.0f}")
            continue
        level = next((s for s in rows if s.t >= back.t and s.training and not math.isnan(s.loss)
                      and s.loss <= loss_ratio * _loss_level(samples, s.t - 5, s.t, e.peer) + loss_slack), None)
        if level is None:
            failures.append(f"{e.kind} {e.peer}: resumed at round {back.round} but its loss never "
                            f"reached the others'")
            continue
        notes.append(f"{e.kind} {e.peer} at {e.at_s:.0f}s: training at {back.t - e.done_s:.0f}s after, round "
                     f"{back.round}; loss {level.loss:.3f} at the others' level {level.t - e.done_s:.0f}s after")
    verdict = FAIL if failures else PASS
    judged = len(subjects) - sum("not judged" in n for n in notes)
    return Check(name, verdict, f"{judged - len(failures)}/{judged} restarted peers resumed"
                 + (f" ({len(subjects) - judged} not judged)" if judged < len(subjects) else ""),
                 tuple(failures + notes))


def converged_at(group: list[Sample]) -> bool:
    """At one poll: every connected daemon sees exactly the connected peers in
    the job (itself included when in it); a partitioned peer is left out on both sides."""
    connected = [s for s in group if s.up and s.linked]
    expected = frozenset(s.peer for s in connected if s.in_job)
    return all(s.view == expected for s in connected)


def convergence_times(samples: list[Sample], events: list[EventRecord]) -> list[float]:
    """Seconds from each event's end to the first poll with converged views (nan: never)."""
    polls = [(t, converged_at(g)) for t, g in _by_time(samples)]
    out = []
    for e in events:
        t = next((t for t, ok in polls if t >= e.done_s and ok), math.nan)
        out.append(t - e.done_s)
    return out


def membership_converged(samples: list[Sample], events: list[EventRecord], bound_s: float) -> Check:
    name = f"membership views converged within {bound_s:.0f}s after each event"
    if not events:
        return Check(name, SKIP, "no events")
    times = convergence_times(samples, events)
    bad = [f"{e.kind} {e.peer} at {e.at_s:.0f}s: " + ("never" if math.isnan(t) else f"{t:.0f}s")
           for e, t in zip(events, times) if math.isnan(t) or t > bound_s]
    finite = [t for t in times if not math.isnan(t)]
    evidence = (f"converged after {len(finite)}/{len(events)} events; median {statistics.median(finite):.1f}s, "
                f"max {max(finite):.1f}s" if finite else "never converged")
    return Check(name, FAIL if bad else PASS, evidence, tuple(bad))


def partitions_healed(samples: list[Sample], events: list[EventRecord], bound_s: float) -> Check:
    """After each heal, within the bound: the views converged with the healed peer
    in everyone's view, and it exchanged with partners again."""
    name = "partitions healed into one job"
    heals = [e for e in events if e.kind == PARTITION]
    if not heals:
        return Check(name, SKIP, "no partition in this run")
    bad, notes = [], []
    for e in heals:
        # Judged until the bound, or until the next event hits the same peer (a leave, a kill).
        cut = min((x.at_s for x in events if x.peer == e.peer and x.at_s > e.done_s), default=math.inf)
        end = min(e.done_s + bound_s, cut)
        window = [s for s in samples if e.done_s <= s.t <= end]
        merged = next((t for t, g in _by_time(window)
                       if converged_at(g) and any(s.peer == e.peer and s.in_job and s.up for s in g)), None)
        gossip = next((s for s in window if s.peer == e.peer and s.training and s.reached > 0
                       and s.t > (merged or math.inf)), None)
        if merged is not None and gossip is not None:
            notes.append(f"{e.peer} healed at {e.done_s:.0f}s: one view after {merged - e.done_s:.0f}s, "
                         f"exchanging with {gossip.reached}/{gossip.planned} partners after {gossip.t - e.done_s:.0f}s")
        elif cut < e.done_s + bound_s:
            notes.append(f"{e.peer} healed at {e.done_s:.0f}s: not judged, the next event on it came "
                         f"{cut - e.done_s:.0f}s later" + ("" if merged is None else
                                                          f" (one view after {merged - e.done_s:.0f}s)"))
        else:
            what = "views did not merge" if merged is None else "it exchanged with no partner"
            bad.append(f"{e.peer} healed at {e.done_s:.0f}s: {what} within {bound_s:.0f}s")
    return Check(name, FAIL if bad else PASS, f"{len(heals) - len(bad)}/{len(heals)} partitions healed",
                 tuple(bad + notes))


def checkpoints_valid(found: list[tuple[str, bool, str]] | None) -> Check:
    """`found`: (path, valid, why) of every checkpoint; None when this build has none."""
    name = "checkpoints valid"
    if found is None:
        return Check(name, SKIP, "skipped: no checkpoints in this build")
    if not found:
        return Check(name, FAIL, "this build checkpoints, but no checkpoint was written")
    bad = [f"{p}: {why}" for p, ok, why in found if not ok]
    return Check(name, FAIL if bad else PASS, f"{len(found) - len(bad)}/{len(found)} checkpoints valid", tuple(bad))


def reached_target(samples: list[Sample], target: float | None, metric: str = "accuracy",
                   mode: str = "max") -> Check:
    """The job's metric at the last evaluation of each peer in the job at the end,
    averaged, reaches the target in the job's direction: ≥ it for metric_mode
    "max", ≤ it for "min". No target (and none by default for this metric): skipped,
    with the values as evidence."""
    label, lower = metric_label(metric), mode == "min"
    target = DEFAULT_TARGETS.get(metric) if target is None else target
    name = (f"the job reached {label} {'≤' if lower else '≥'} {target:g}" if target is not None
            else f"the job's {label} (no target)")
    last: dict[str, Sample] = {}
    for s in samples:
        if s.in_job and s.up and not math.isnan(s.metric):
            last[s.peer] = s
    end = max((s.t for s in samples), default=0.0)
    final = [s for s in last.values() if any(x.peer == s.peer and x.t == end and x.in_job for x in samples)]
    if not final:
        verdict = FAIL if target is not None else SKIP
        return Check(name, verdict, "no peer in the job at the end had evaluated the model")
    values = [s.metric for s in final]
    mean, best = statistics.fmean(values), min(values) if lower else max(values)
    evidence = (f"mean last {label} {mean:.4f} over {len(final)} peers (best {best:.4f}; "
                f"{'lower' if lower else 'higher'} is better)")
    details = tuple(f"{s.peer}: {s.metric:.4f} at {s.t:.0f}s" for s in sorted(final, key=lambda s: s.peer))
    if target is None:
        return Check(name, SKIP, f"{evidence}; no --target given", details)
    return Check(name, PASS if (mean <= target if lower else mean >= target) else FAIL, evidence, details)


@dataclass(frozen=True)
class Goal:
    """What the soaked job must reach, in its own terms: `target` (None: the
    metric's default, if it has one) of its `metric`, by its `metric_mode`."""

    target: float | None
    metric: str = "accuracy"
    mode: str = "max"


def run_checks(samples: list[Sample], events: list[EventRecord], *, ceiling_s: float, stall_s: float,
               converge_s: float, goal: Goal, checkpoints: list[tuple[str, bool, str]] | None) -> list[Check]:
    return [
        daemons_alive(samples),
        rounds_within_deadline(samples, ceiling_s, stall_s),
        restarted_resumed(samples, events),
        membership_converged(samples, events, converge_s),
        partitions_healed(samples, events, converge_s),
        checkpoints_valid(checkpoints),
        reached_target(samples, goal.target, goal.metric, goal.mode),
    ]
