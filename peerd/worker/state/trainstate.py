"""The whole training state of a peer, registered once, in one fixed layout.

What a newcomer, a restarted worker and a checkpoint receive (docs/algorithms.md §1.9):

    vector  fp32: the gossiped tensors (parameters, then any buffers or optimizer
            moments the job averages), then every other fp32 tensor of the state
            (BatchNorm statistics, momentum, Adam's moments), in a fixed order;
            with [outer], last, the outer step's anchor and momentum buffer
            (one value per parameter element each; docs/algorithms.md, "The outer step")
    extra   a small torch.save blob: integer buffers (`num_batches_tracked`),
            the optimizer's scalar state (Adam's `step`), and the state_dict of
            every registered object (GradScaler, LR scheduler, a script's own)

The vector is verified like the parameters always were (SHA-256, finite values,
lengths); the extra blob is loaded with `weights_only=True`, so it can hold
tensors and plain values but no code.
"""

from __future__ import annotations

import hashlib
import io
import logging
from typing import Protocol

import torch
from torch import nn

from peerd.worker.state.flatparams import FlatParams
from peerd.worker.state.frozen import Check, Frozen, buffer_frozen, param_frozen
from peerd.worker.train.optim import state_tensors

log = logging.getLogger("peerd.worker")


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, /) -> object: ...


def _buffers(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
    """The model's persistent buffers: (fp32 ones, the others). A non-persistent
    buffer (a causal mask, a cache) is rebuilt by the model and does not travel."""
    persistent = set(model.state_dict())
    floats, others = [], []
    for name, buf in model.named_buffers():
        if name in persistent:
            (floats if buf.dtype == torch.float32 else others).append((name, buf))
    return floats, others


class TrainState:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, average_buffers: bool = False,
                 average_optimizer_state: bool = False, objects: dict[str, Stateful] | None = None,
                 outer: bool = False) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        floats, self._int_buffers = _buffers(model)
        moments = state_tensors(optimizer, params)
        gossiped = (floats if average_buffers else []) + (moments if average_optimizer_state else [])
        kept = (floats if not average_buffers else []) + (moments if not average_optimizer_state else [])
        self.flat = FlatParams(model, [t for _, t in gossiped])
        # [outer]: the anchor starts at the model the job starts from; the buffer at zero.
        live = self.flat.vector[: sum(p.numel() for p in params)]
        self.anchor = live.clone() if outer else None
        self.outer_momentum = torch.zeros_like(live) if outer else None
        outers = [("outer.anchor", self.anchor), ("outer.momentum", self.outer_momentum)] if outer else []
        self.kept = [t for _, t in kept + outers]
        # The model's buffers outside the gossiped vector: the end consensus takes them too (finalmodel).
        self.kept_float_buffers = [t for _, t in floats] if not average_buffers else []
        self.kept_float_buffers += [t for _, t in self._int_buffers if t.is_floating_point()]  # fp16, fp64, ...
        self.int_buffers = [t for _, t in self._int_buffers if not t.is_floating_point()]
        self.names = [n for n, _ in gossiped + kept + outers]
        self.model = model
        self.optimizer = optimizer
        self.params = params
        self._moment_keys = {name for name, _ in moments}
        self.objects: dict[str, Stateful] = dict(objects or {})
        # What is frozen now, range by range of the vector: rounds and adopt() leave it alone.
        # The outer step's values are frozen with their parameter, element for element.
        by_param = [(p.numel(), param_frozen(p)) for p in params]
        self.frozen = Frozen(by_param + [(t.numel(), self._frozen(n)) for n, t in gossiped + kept]
                             + (by_param * 2 if outer else []))
        self._int_frozen = {name: buffer_frozen(model, name) for name, _ in self._int_buffers}

    def _frozen(self, name: str) -> Check:
        """An optimizer moment ("k.key") is frozen with its parameter, a buffer with its module."""
        if name in self._moment_keys:
            return param_frozen(self.params[int(name.partition(".")[0])])
        return buffer_frozen(self.model, name)

    @property
    def numel(self) -> int:
        return self.flat.numel + sum(t.numel() for t in self.kept)

    @property
    def gossiped(self) -> int:
        """Elements of the vector that gossip averages (its first part)."""
        return self.flat.numel

    def register(self, name: str, obj: Stateful) -> None:
        """Something more a newcomer must receive (anything with state_dict and
        load_state_dict): registered before the first exchange, on every peer."""
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"{name!r}: {type(obj).__name__} has no state_dict()/load_state_dict()")
        self.objects[name] = obj

    def fingerprint(self, spec_fingerprint: str) -> str:
        """The spec and the state's layout: peers must agree on both to exchange."""
        shapes = self.flat.shapes + [tuple(t.shape) for t in self.kept]
        text = spec_fingerprint + repr((shapes, self.gossiped, sorted(self.objects)))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def parts(self) -> list[torch.Tensor]:
        """The vector's parts, in order (they may live on a GPU)."""
        return [self.flat.vector, *self.kept]

    def vector(self) -> torch.Tensor:
        """A CPU copy of the whole vector."""
        return torch.cat([p.detach().reshape(-1).cpu() for p in self.parts()])

    def extra(self) -> bytes:
        """The state that is not the vector, serialised."""
        scalars = {}
        for k, p in enumerate(self.params):
            for key, value in self.optimizer.state.get(p, {}).items():
                if f"{k}.{key}" not in self._moment_keys:
                    scalars[f"{k}.{key}"] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
        blob = {
            "lrs": [float(group["lr"]) for group in self.optimizer.param_groups],
            "buffers": {name: buf.detach().cpu() for name, buf in self._int_buffers},
            "optimizer": scalars,
            "objects": {name: obj.state_dict() for name, obj in sorted(self.objects.items())},
        }
        out = io.BytesIO()
        torch.save(blob, out)
        return out.getvalue()

    def adopt(self, vector: torch.Tensor, extra: bytes) -> None:
        """Continue from a donor's state (already verified finite); what is
        frozen here keeps this peer's values (docs/algorithms.md, "Frozen tensors")."""
        if vector.numel() != self.numel:
            raise ValueError(f"state of {vector.numel()} elements, expected {self.numel}")
        blob = self._load_extra(extra)
        spans = self.frozen.spans()
        if spans:
            own, vector = self.vector(), vector.clone()  # a state transfer is rare: one copy more
            for a, b in spans:
                vector[a:b] = own[a:b]
            log.info("state taken: kept this worker's own values of %d frozen elements (requires_grad=False, "
                     "or a module in eval mode)", sum(b - a for a, b in spans))
        offset = 0
        with torch.no_grad():
            for part in self.parts():
                part.view(-1).copy_(vector[offset : offset + part.numel()])
                offset += part.numel()
            for name, buf in self._int_buffers:
                if not self._int_frozen[name]():
                    buf.copy_(blob["buffers"][name])
            by_key = {f"{k}.{key}": (p, key) for k, p in enumerate(self.params)
                      for key in self.optimizer.state.get(p, {})}
            for name, value in blob["optimizer"].items():
                p, key = by_key[name]
                current = self.optimizer.state[p][key]
                if isinstance(current, torch.Tensor):
                    current.copy_(value)
                else:
                    self.optimizer.state[p][key] = value
        # The LR in the optimizer's groups too: a scheduler's restored position
        # alone does not reach them (torchtitan's newcomers trained at the wrong LR).
        for group, lr in zip(self.optimizer.param_groups, blob["lrs"]):
            group["lr"] = lr
        for name, obj in self.objects.items():
            obj.load_state_dict(blob["objects"][name])

    def _load_extra(self, extra: bytes) -> dict:
        try:
            blob = torch.load(io.BytesIO(extra), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a corrupt or hostile blob, whatever unpickling says
            raise ValueError(f"the state's extra part does not load: {type(exc).__name__}: {exc}") from None
        if isinstance(blob, dict) and len(blob.get("lrs", ())) != len(self.optimizer.param_groups):
            raise ValueError("the state's optimizer has another number of parameter groups")
        want = {
            "lrs": None,
            "buffers": {name for name, _ in self._int_buffers},
            "optimizer": {f"{k}.{key}" for k, p in enumerate(self.params) for key in self.optimizer.state.get(p, {})}
            - self._moment_keys,
            "objects": set(self.objects),
        }
        if not isinstance(blob, dict) or set(blob) != set(want):
            raise ValueError("the state's extra part is not a peerd training state")
        for part, names in want.items():
            if names is not None and (not isinstance(blob[part], dict) or set(blob[part]) != names):
                raise ValueError(f"the state's {part} hold {sorted(blob[part])}, expected {sorted(names)}")
        return blob
