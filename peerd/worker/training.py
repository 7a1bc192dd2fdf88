"""The local half of a worker: model, optimizer, data shard, one step at a time.

Blocking torch code; the worker runs it in a thread so that its event loop keeps
serving partners while it computes.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

from peerd.core.lr import ScaleRamp, cosine
from peerd.core.partition import my_shard
from peerd.core.rng import derive_seed
from peerd.errors import ConfigError
from peerd.jobspec import JobSpec
from peerd.worker.flat import FlatParams

log = logging.getLogger("peerd.worker")


def load_entry(entry: str, spec_dir: str = ""):
    """Import "module:callable", looking next to the job file first."""
    module_name, _, attr = entry.partition(":")
    if spec_dir and spec_dir not in sys.path:
        sys.path.insert(0, spec_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"cannot import {module_name!r} for {entry!r}: no module named {exc.name!r} "
            "(the job's model and data code must be installed on this machine or sit next to the job file)"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no {attr!r} (from {entry!r})") from None


def resolve_device(name: str) -> torch.device:
    """The torch device for a worker: "auto" is the first GPU if there is one."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"worker.device = {name!r}, but torch sees no CUDA device here")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"worker.device = {name!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"worker.device = {name!r}, but MPS is not available here")
    return device


def init_seed(spec: JobSpec, peer_id: str) -> int:
    """The seed of the initial model: shared by the job, or this peer's own."""
    if spec.init == "shared":
        return spec.seed
    return int.from_bytes(derive_seed(spec.seed, peer_id)[:8], "little")


class Trainer:
    def __init__(self, spec: JobSpec, peer_id: str, spec_dir: str = "", device: str = "cpu") -> None:
        self.spec = spec
        self.peer_id = peer_id
        self.device = resolve_device(device)
        torch.manual_seed(init_seed(spec, peer_id))  # the same model on every device type: built on the CPU
        make_model, make_data = load_entry(spec.model, spec_dir), load_entry(spec.data, spec_dir)
        try:
            self.model: nn.Module = make_model().float().to(self.device)
            self.flat = FlatParams(self.model)
            self.train_set, self.test_set = make_data()
        except Exception as exc:  # the job's own code: it will fail the same way on a restart
            raise ConfigError(f"the job's model or data could not be built: {type(exc).__name__}: {exc}") from exc
        if len(self.train_set) == 0 or len(self.test_set) == 0:
            raise ConfigError(f"{spec.data} returned an empty training or test set")
        opt = spec.optimizer
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=opt.lr, momentum=opt.momentum,
            weight_decay=opt.weight_decay, nesterov=opt.nesterov,
        )
        # Momentum buffers as views into one flat vector too, so the whole
        # training state is two vectors a newcomer can copy (SGD updates them in place).
        self.momentum = self.flat.attach(self.optimizer, "momentum_buffer")
        self.step_count = 0
        self.samples = 0
        self.epoch = 0
        self._shard: list[int] = []
        self._pos = 0
        self._started = False
        self._resume_at = 0.0  # fraction of the first shard already read (after adopting a state)
        self.loss_ema = math.nan
        self.speed_ema = math.nan  # samples/s of compute only
        self.ramp = ScaleRamp(opt.reference_batch, opt.ramp_steps)
        self.lr = math.nan

    @property
    def progress(self) -> float:
        """Epochs done, fractional."""
        return self.epoch + (self._pos / len(self._shard) if self._shard else 0.0)

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs

    def _lr(self, trainers: int) -> float:
        """Schedule × linear-scaling multiplier, ramped when the global batch changes."""
        opt = self.spec.optimizer
        if self.ramp.set_batch(self.spec.local_batch * trainers, self.step_count):
            log.info("global batch now %d: LR scale ramps to %.3f", self.ramp.batch,
                     self.ramp.batch / opt.reference_batch)
        decay = cosine(self.progress / self.spec.epochs) if opt.schedule == "cosine" else 1.0
        return opt.lr * decay * self.ramp.scale(self.step_count)

    def _next_indices(self, members: Sequence[str]) -> list[int]:
        while self._pos >= len(self._shard):
            if self._started:  # the shard is used up: the next epoch begins
                self.epoch += 1
                self._shard, self._pos = [], 0
            if self.done:
                return []
            # The view at the start of an epoch decides the split for that epoch;
            # a shard may be empty when peers outnumber samples.
            self._shard = my_shard(len(self.train_set), self.spec.name, self.epoch, members, self.peer_id)
            self._pos, self._started = int(self._resume_at * len(self._shard)), True
            self._resume_at = 0.0
        batch = self._shard[self._pos : self._pos + self.spec.local_batch]
        self._pos += len(batch)
        return batch

    def step(self, members: Sequence[str], trainers: int = 0) -> float:
        """One optimizer step on the next local batch; returns the loss.

        `members` (every peer in the job) split the data; `trainers` (the peers
        that train now, default: the members) make the global batch the LR is
        scaled for: a peer that is still starting adds no samples yet."""
        started = time.perf_counter()
        indices = self._next_indices(members)
        if not indices:
            return math.nan
        x, y = self._to_device(_batch(self.train_set, indices))
        self.lr = self._lr(trainers or len(set(members)))
        for group in self.optimizer.param_groups:  # momentum buffers are kept as they are
            group["lr"] = self.lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        loss = loss.detach()
        elapsed = time.perf_counter() - started
        self.step_count += 1
        self.samples += len(y)
        value = loss.item()
        self.loss_ema = value if math.isnan(self.loss_ema) else 0.9 * self.loss_ema + 0.1 * value
        speed = len(y) / max(elapsed, 1e-9)
        self.speed_ema = speed if math.isnan(self.speed_ema) else 0.9 * self.speed_ema + 0.1 * speed
        return value

    @torch.no_grad()
    def evaluate(self, batch: int = 500) -> float:
        self.model.eval()
        correct = 0
        for start in range(0, len(self.test_set), batch):
            x, y = self._to_device(_batch(self.test_set, range(start, min(start + batch, len(self.test_set)))))
            correct += int((self.model(x).argmax(1) == y).sum())
        return correct / len(self.test_set)

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.device.type == "cpu":
            return batch
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def save(self, path: Path, **meta: object) -> None:
        """Write the model atomically: a crash mid-write leaves the old file.
        Tensors are saved from the CPU, so the file loads on any machine."""
        tmp = path.with_name(path.name + ".tmp")
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        with open(tmp, "wb") as f:
            torch.save({"state_dict": state, "step": self.step_count, **meta}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def state_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training state a newcomer needs: parameters and momentum."""
        return self.flat.vector, self.momentum

    def adopt_state(self, vector: torch.Tensor, step: int, progress: float) -> None:
        """Continue from a donor's state: parameters, momentum, step count and
        position in the data and the LR schedule."""
        n = self.flat.numel
        if vector.numel() != 2 * n:
            raise ValueError(f"state of {vector.numel()} elements, expected {2 * n}")
        if not torch.isfinite(vector).all():
            raise ValueError("state holds non-finite values")
        self.flat.vector.copy_(vector[:n])
        self.momentum.copy_(vector[n:])
        self.step_count = step
        self.epoch, self._resume_at = int(progress), progress - int(progress)
        self._shard, self._pos, self._started = [], 0, False


def _batch(dataset: Dataset, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(dataset, TensorDataset):
        index = torch.as_tensor(list(indices), dtype=torch.long)
        x, y = dataset.tensors
        return x[index], y[index]
    return default_collate([dataset[i] for i in indices])
