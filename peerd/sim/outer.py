"""The outer step in the simulator (docs/algorithms.md, "The outer step").

Every simulated peer keeps an anchor θ₀ and an outer momentum buffer, one row
per slot as the parameters are. After each round the peers' rows go through
peerd.core.outer.outer_step, the function the real worker calls, on torch
views of the numpy rows, so the arithmetic is the worker's op for op.
"""

from __future__ import annotations

import numpy as np
import torch

from peerd.core.outer import OuterSlices, outer_step
from peerd.settings.jobspec import OuterSpec
from peerd.sim.algorithms import State, contiguous


class OuterState:
    def __init__(self, rule: OuterSpec, start: np.ndarray) -> None:
        """`start`: the parameter matrix as the job starts (rows = slots); the
        anchors start there and the buffers at zero, as the worker's do."""
        self.rule = rule
        self.anchor = start.copy()
        self.buffer = np.zeros_like(start)

    def join(self, slot: int, donor: int) -> None:
        """A newcomer takes its donor's anchor and buffer with its model."""
        self.anchor[slot] = self.anchor[donor]
        self.buffer[slot] = self.buffer[donor]

    def step(self, state: State, live: np.ndarray) -> None:
        """After a round: every live peer's anchor steps by its change θ₀ − θ,
        θ the model the round left it, and the model becomes the anchor."""
        rows = contiguous(live)
        anchor = np.ascontiguousarray(self.anchor[rows])
        buffer = np.ascontiguousarray(self.buffer[rows])
        model = np.array(state.models(live), dtype=np.float32)  # a copy: push-sum's x/w is written back below
        outer_step(self.rule, OuterSlices(torch.from_numpy(anchor), torch.from_numpy(model), torch.from_numpy(buffer)))
        self.anchor[rows] = anchor
        self.buffer[rows] = buffer
        # push-sum keeps x = θ·w; every other algorithm has w = 1
        state.x[rows] = model * state.w[rows, None].astype(np.float32)
