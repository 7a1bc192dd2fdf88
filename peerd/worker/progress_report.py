"""The engine's state as the Progress message its daemon shows (peerctl status,
peers, metrics) and relays in Hello."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from peerd.core.checkpoints import LastCheckpoint
from peerd.core.outer import describe as describe_outer
from peerd.settings.jobspec import JobSpec
from peerd.proto.v1 import control_pb2
from peerd.worker.round.shared import RoundResult
from peerd.worker.train.source import Source
from peerd.worker.wire.traffic import ExchangeTimes, Traffic


class TimeSpent:
    """Where the training's wall time goes besides its steps (Progress.waited_s)."""

    def __init__(self) -> None:
        self.since = math.nan  # monotonic time training started
        self.waited = {"round": 0.0, "evaluate": 0.0, "checkpoint": 0.0}

    def start(self) -> None:
        self.since = time.monotonic()

    @property
    def training_s(self) -> float:
        """Wall seconds since training started here (0 before)."""
        return time.monotonic() - self.since if math.isfinite(self.since) else 0.0

    def add(self, cause: str, since: float) -> float:
        """Add the time since `since` to what the training waited for `cause`; returns now."""
        now = time.monotonic()
        self.waited[cause] += now - since
        return now


@dataclass(frozen=True)
class EngineFigures:
    """The engine's side of a Progress: where it stands and what its rounds did."""

    round: int
    phase: str
    metrics: Mapping[str, float]  # the last evaluation
    checkpoint: LastCheckpoint
    exported: tuple[str, int]  # peerctl export: the last file written, and its round
    misses: int  # segments missed, all rounds
    exchange: ExchangeTimes
    intrahost: str
    rejected: Mapping[str, int]
    traffic: Traffic
    time: TimeSpent
    collapsed: str = ""  # why training collapsed (peerd.core.health); empty while it has not


def progress_of(t: Source, engine: EngineFigures, spec: JobSpec, result: RoundResult | None,
                previous: control_pb2.Progress, finished: bool = False) -> control_pb2.Progress:
    """`result`: the round just done (None: keep `previous`'s exchange figures)."""
    times = engine.exchange
    p = control_pb2.Progress(
        step=t.step_count, round=engine.round, epoch=t.epoch, loss=t.loss_ema,
        samples_per_s=t.speed_ema, fixed_s=t.meter.fixed_s, per_sample_s=t.meter.per_sample_s,
        metric=engine.metrics.get(spec.metric, math.nan), samples=t.samples,
        metric_name=spec.metric, metric_higher_better=spec.metric_mode == "max",
        metrics=engine.metrics, skipped_steps=t.skipped_steps,
        segment_misses=engine.misses, finished=finished, disagreement=math.nan, exchange_s=math.nan, lr=t.lr,
        phase="finished" if finished else engine.phase, global_batch=t.global_batch,
        rejected=dict(engine.rejected),
        local_batch=t.local_batch, share=t.share, compute_s=t.compute_s,
        rounds_done=times.count, bytes_sent=engine.traffic.sent,
        bytes_received=engine.traffic.received, exchange_buckets=times.buckets,
        exchange_sum_s=times.sum_s, exchange_count=times.count,
        checkpoint_round=engine.checkpoint.round, checkpoints_written=engine.checkpoint.written,
        exported=engine.exported[0], exported_round=engine.exported[1], intrahost=engine.intrahost,
        data_samples=getattr(t, "data_samples", 0), data_mode=spec.data_mode,
        job_progress=getattr(t, "progress", 0.0), epochs_read=getattr(t, "epochs_read", 0.0),
        training_s=engine.time.training_s, waited_s=engine.time.waited,
        collapsed=bool(engine.collapsed), collapse_reason=engine.collapsed,
        lr_law=t.lr_control.law(), lr_scale=t.lr_control.scale, outer=describe_outer(spec.outer.every, spec.outer),
    )
    if result is not None:
        p.partners_reached = len(result.reached)
        p.partners_planned = len(result.planned)
        p.disagreement = result.disagreement
        p.exchange_s = result.seconds
    elif previous.partners_planned:
        p.partners_reached, p.partners_planned = previous.partners_reached, previous.partners_planned
        p.disagreement, p.exchange_s = previous.disagreement, previous.exchange_s
    return p
