"""The Progress message before anything is known: NaN, not a misleading 0."""

from __future__ import annotations

import math

from peerd.proto.v1 import control_pb2


def empty_progress() -> control_pb2.Progress:
    nan = math.nan
    return control_pb2.Progress(
        loss=nan, samples_per_s=nan, test_accuracy=nan, disagreement=nan, exchange_s=nan, lr=nan, share=nan,
    )
