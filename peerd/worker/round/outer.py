"""The outer step after each round (docs/algorithms.md, "The outer step"):
the round averaged the models of the last H local steps; the anchor then takes
an SGD step with momentum by the averaged change (peerd.core.outer) and the
model starts the next H steps from it.

The anchor and the momentum buffer live in the training state (TrainState:
`anchor`, `outer_momentum`), so newcomers and checkpoints receive them with
the model. What the training froze is not stepped: the model keeps its values
there, the buffer too, and the anchor follows the model.
"""

from __future__ import annotations

import torch

from peerd.core.outer import OuterSlices, live_spans, outer_step
from peerd.settings.jobspec import OuterSpec
from peerd.worker.state.trainstate import TrainState


class OuterStep:
    def __init__(self, outer: OuterSpec, state: TrainState) -> None:
        if state.anchor is None or state.outer_momentum is None:
            raise ValueError("the outer step needs a training state made with outer=True")
        self.rule = outer
        self.state = state
        self.steps = 0  # outer steps this process took

    def step(self) -> None:
        """After a round (or none, with nobody to average with: then the change
        is this member's own): the anchor steps, the model becomes it."""
        state = self.state
        anchor, momentum = state.anchor, state.outer_momentum
        n = anchor.numel()
        model = state.flat.vector[:n]  # asked now: a round may have moved the model into another buffer
        frozen = state.frozen.spans(n)
        with torch.no_grad():
            for a, b in live_spans(n, frozen):
                outer_step(self.rule, OuterSlices(anchor[a:b], model[a:b], momentum[a:b]))
            for a, b in frozen:
                anchor[a : min(b, n)].copy_(model[a : min(b, n)])
        self.steps += 1
