"""The engine's state as the Progress message its daemon shows (peerctl status,
peers, metrics) and relays in Hello."""

from __future__ import annotations

import math

from peerd.proto.v1 import control_pb2
from peerd.worker.gossip import RoundResult


def progress_of(engine, result: RoundResult | None, finished: bool = False) -> control_pb2.Progress:
    """`result`: the round just done (None: keep the last round's exchange figures)."""
    t, times = engine.source, engine.rounds.exchange_times
    p = control_pb2.Progress(
        step=t.step_count, round=engine.round, epoch=t.epoch, loss=t.loss_ema,
        samples_per_s=t.speed_ema, fixed_s=t.meter.fixed_s, per_sample_s=t.meter.per_sample_s,
        metric=engine.metrics.get(engine.spec.metric, math.nan), samples=t.samples,
        metric_name=engine.spec.metric, metric_higher_better=engine.spec.metric_mode == "max",
        metrics=engine.metrics, skipped_steps=t.skipped_steps,
        segment_misses=engine.rounds.misses, finished=finished, disagreement=math.nan, exchange_s=math.nan, lr=t.lr,
        phase="finished" if finished else engine.phase, global_batch=t.global_batch,
        rejected=dict(engine.rejections.counts),
        local_batch=t.local_batch, share=t.share, compute_s=t.compute_s,
        rounds_done=times.count, bytes_sent=engine.traffic.sent,
        bytes_received=engine.traffic.received, exchange_buckets=times.buckets,
        exchange_sum_s=times.sum_s, exchange_count=times.count,
        checkpoint_round=engine.checkpoints.round, checkpoints_written=engine.checkpoints.written,
        exported=engine.exported, exported_round=engine.exported_round, intrahost=engine.rounds.intrahost_status,
        data_samples=getattr(t, "data_samples", 0), data_mode=engine.spec.data_mode,
        job_progress=getattr(t, "progress", 0.0), epochs_read=getattr(t, "epochs_read", 0.0),
        training_s=engine.training_s, waited_s=engine.waited,
    )
    if result is not None:
        p.partners_reached = len(result.reached)
        p.partners_planned = len(result.planned)
        p.disagreement = result.disagreement
        p.exchange_s = result.seconds
    elif engine.link.progress.partners_planned:
        old = engine.link.progress
        p.partners_reached, p.partners_planned = old.partners_reached, old.partners_planned
        p.disagreement, p.exchange_s = old.disagreement, old.exchange_s
    return p
