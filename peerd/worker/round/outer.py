"""The outer step after each round (docs/algorithms.md, "The outer step"):
the round averaged the models of the last H local steps; the anchor then takes
an SGD step with momentum by the averaged change (peerd.core.outer) and the
model starts the next H steps from it.

Three ways the averaged change arrives: as the round's averaged model (`step`);
as the averaged model relative to the anchor, on the int8 wire
(`step_by_change`, with `adopt_anchor` for its rounds that average the
anchors); and one outer step late with `[gossip] overlap` (`on_mixed` turns
the round's result into the correction the overlapped round applies:
docs/algorithms.md, "The outer step overlapped").

The anchor and the momentum buffer live in the training state (TrainState:
`anchor`, `outer_momentum`), so newcomers and checkpoints receive them with
the model. What the training froze is not stepped: the model keeps its values
there, the buffer too, and the anchor follows the model.
"""

from __future__ import annotations

import torch

from peerd.core.outer import OuterSlices, live_spans, outer_step, step_by_change
from peerd.settings.jobspec import OuterSpec
from peerd.worker.state.trainstate import TrainState


class OuterStep:
    def __init__(self, outer: OuterSpec, state: TrainState) -> None:
        if state.anchor is None or state.outer_momentum is None:
            raise ValueError("the outer step needs a training state made with outer=True")
        self.rule = outer
        self.state = state
        self.steps = 0  # outer steps this process took

    @property
    def numel(self) -> int:
        """The parameters' share of the gossiped vector (its start): what steps."""
        return self.state.anchor.numel()

    def spans(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        n = self.numel
        frozen = self.state.frozen.spans(n)
        return live_spans(n, frozen), frozen

    def step(self) -> None:
        """After a round (or none, with nobody to average with: then the change
        is this member's own): the anchor steps, the model becomes it."""
        state = self.state
        anchor, momentum = state.anchor, state.outer_momentum
        model = state.flat.vector[: self.numel]  # asked now: a round may have moved the model into another buffer
        live, _ = self.spans()
        with torch.no_grad():
            for a, b in live:
                outer_step(self.rule, OuterSlices(anchor[a:b], model[a:b], momentum[a:b]))
        self.follow_frozen()
        self.steps += 1

    def change_of(self, vector: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of the gossiped vector `vector` (into `into`, on its device,
        if given) with its parameters taken relative to the anchor (θ − θ₀):
        on the int8 wire, what is sent. The rest (averaged buffers and
        moments) as it is."""
        change = vector.clone() if into is None else into.copy_(vector)
        with torch.no_grad():
            change[: self.numel].sub_(self.state.anchor.to(change.device))
        return change

    def anchor_of(self, vector: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """`into` (any device) holding the gossiped vector `vector` with its
        parameters replaced by the anchor: what an anchor round publishes."""
        into.copy_(vector)
        with torch.no_grad():
            into[: self.numel].copy_(self.state.anchor)
        return into

    def adopt_anchor(self, mixed: torch.Tensor, published: torch.Tensor) -> None:
        """An anchor round: the anchor takes `mixed` (the averaged anchors, then
        the plain average of the rest) and the model moves with it by
        `mixed − published`, keeping its local steps since; the rest takes the
        average. The momentum buffer is not touched: no outer step."""
        state = self.state
        anchor, n, model = state.anchor, self.numel, state.flat.vector
        live, _ = self.spans()
        with torch.no_grad():
            for a, b in live:
                values = mixed[a:b].to(anchor.device)
                model[a:b].add_(values.sub(published[a:b].to(anchor.device)))
                anchor[a:b].copy_(values)
            model[n:].copy_(mixed[n:])

    def step_by_change(self, mixed: torch.Tensor) -> None:
        """After a round over changes (`mixed`: the averaged θ − θ₀, then the
        plain average of the rest, on any device): the anchor steps by it, the
        model becomes the anchor, the rest takes the round's average."""
        state = self.state
        anchor, momentum, n = state.anchor, state.outer_momentum, self.numel
        model = state.flat.vector
        live, _ = self.spans()
        with torch.no_grad():
            for a, b in live:
                step_by_change(self.rule, anchor[a:b], momentum[a:b], mixed[a:b].to(anchor.device))
                model[a:b].copy_(anchor[a:b])
            model[n:].copy_(mixed[n:])
        self.follow_frozen()
        self.steps += 1

    def on_mixed(self, mixed: torch.Tensor, kind: str) -> None:
        """An overlapped round completed: turn its result `mixed` (of `kind`:
        "models", "changes" relative to the anchor, or "anchors") into what
        the correction x ← x + (mixed − snapshot) must add: the new anchor
        after the outer step (models), how far the anchor moved (changes), or
        the averaged anchors as they are, which the anchor takes (anchors).
        Each way the model becomes the new anchor plus the local steps since
        the snapshot (docs/algorithms.md, "The outer step overlapped")."""
        anchor, momentum = self.state.anchor, self.state.outer_momentum
        live, _ = self.spans()
        with torch.no_grad():
            for a, b in live:
                values = mixed[a:b].to(anchor.device)  # the same tensor on the CPU
                if kind == "anchors":
                    anchor[a:b].copy_(values)
                    continue
                if kind == "changes":
                    before = anchor[a:b].clone()
                    step_by_change(self.rule, anchor[a:b], momentum[a:b], values)
                    values = anchor[a:b].sub(before)
                else:
                    outer_step(self.rule, OuterSlices(anchor[a:b], values, momentum[a:b]))
                mixed[a:b].copy_(values)
        self.steps += kind != "anchors"

    def follow_frozen(self) -> None:
        """Frozen parameters' anchor follows the model, so a parameter unfrozen
        later starts its change from where it is."""
        anchor, n = self.state.anchor, self.numel
        model = self.state.flat.vector
        with torch.no_grad():
            for a, b in self.state.frozen.spans(n):
                anchor[a : min(b, n)].copy_(model[a : min(b, n)])
