"""The Progress message before anything is known: NaN, not a misleading 0."""

from __future__ import annotations

import math

from peerd.proto.v1 import control_pb2

# Upper bounds (seconds) of the exchange-time histogram a worker keeps and the
# daemon exports (peerd_exchange_seconds); the worker and daemon share them here.
EXCHANGE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def empty_progress() -> control_pb2.Progress:
    nan = math.nan
    return control_pb2.Progress(
        loss=nan, samples_per_s=nan, metric=nan, disagreement=nan, exchange_s=nan, lr=nan, share=nan,
        fixed_s=nan, per_sample_s=nan, lr_scale=nan,
    )
