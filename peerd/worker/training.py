"""The local half of a worker: model, optimizer, its parts of the data, one step at a time.

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
from peerd.core.partition import chunk_at, chunk_bounds, epoch_permutation, part_bounds
from peerd.core.shares import BatchPlan
from peerd.core.rng import derive_seed
from peerd.errors import ConfigError
from peerd.jobspec import JobSpec
from peerd.worker.codec import all_finite
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
    def __init__(
        self, spec: JobSpec, peer_id: str, spec_dir: str = "", slowdown: float = 1.0, device: str = "cpu"
    ) -> None:
        if not (math.isfinite(slowdown) and slowdown >= 1.0):
            raise ConfigError(f"slowdown must be a number ≥ 1, got {slowdown}")
        self.spec = spec
        self.peer_id = peer_id
        self.slowdown = slowdown  # testing knob: sleep (slowdown − 1) × compute after each step
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
        self._bounds = chunk_bounds(len(self.train_set), spec.epoch_chunks)
        self._perm: tuple[int, list[int]] = (-1, [])  # (epoch, its permutation)
        self._chunk = -1  # the chunk of the epoch being read; -1: none yet
        self._part: list[int] = []  # this peer's part of it
        self._pos = 0  # samples of the part read
        self.loss_ema = math.nan
        self.speed_ema = math.nan  # samples/s of compute (with the slowdown's sleep), no network wait
        self._ema_samples = self._ema_seconds = 0.0
        self.local_batch = spec.local_batch  # of the last step
        self.share = math.nan  # this peer's part of the current chunk's data (DBS), NaN when equal
        self.compute_s = 0.0  # total time in steps, the slowdown's sleep included
        self.ramp = ScaleRamp(opt.reference_batch, opt.ramp_steps)
        self.lr = math.nan

    @property
    def progress(self) -> float:
        """Epochs done, fractional: the position reached in the epoch's
        permutation, inside a chunk in proportion to this peer's part read."""
        if self._chunk < 0:
            return float(self.epoch)
        start, stop = self._bounds[self._chunk], self._bounds[self._chunk + 1]
        read = self._pos / len(self._part) if self._part else 1.0
        return self.epoch + (start + (stop - start) * read) / self._bounds[-1]

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs

    def _lr(self, global_batch: int) -> float:
        """Schedule × linear-scaling multiplier, ramped when the global batch changes."""
        opt = self.spec.optimizer
        if self.ramp.set_batch(global_batch, self.step_count):
            log.info("global batch now %d: LR scale ramps to %.3f", self.ramp.batch,
                     self.ramp.batch / opt.reference_batch)
        decay = cosine(self.progress / self.spec.epochs) if opt.schedule == "cosine" else 1.0
        return opt.lr * decay * self.ramp.scale(self.step_count)

    def _next_indices(self, members: Sequence[str], plan: BatchPlan | None) -> list[int]:
        """The rest of this peer's part of the current chunk, then its parts of
        the next chunks. A batch may span chunks, not epochs: an epoch's last
        batch may be short."""
        size = plan.batch(self.peer_id) if plan is not None else self.spec.local_batch
        batch: list[int] = []
        while len(batch) < size and not self.done:
            if self._pos < len(self._part):
                taken = self._part[self._pos : self._pos + size - len(batch)]
                self._pos += len(taken)
                batch += taken
            elif self._chunk + 1 < self.spec.epoch_chunks:
                self._start_chunk(self._chunk + 1, members, plan)
            elif batch:
                break
            else:
                self.epoch, self._chunk, self._part, self._pos = self.epoch + 1, -1, [], 0
        return batch

    def _start_chunk(self, chunk: int, members: Sequence[str], plan: BatchPlan | None) -> None:
        """Take this peer's part of `chunk`, split among the members (and by the
        DBS plan's shares) seen now; a part may be empty when peers outnumber
        the chunk's samples."""
        if self._perm[0] != self.epoch:
            self._perm = (self.epoch, epoch_permutation(self._bounds[-1], self.spec.name, self.epoch))
        shares = plan.shares() if plan is not None else None
        self.share = shares[self.peer_id] if shares else math.nan
        start, stop = part_bounds(self._bounds[chunk], self._bounds[chunk + 1],
                                  plan.ids if plan is not None else members, self.peer_id, shares)
        self._chunk, self._part, self._pos = chunk, self._perm[1][start:stop], 0

    def step(self, members: Sequence[str], trainers: int = 0, plan: BatchPlan | None = None) -> float:
        """One optimizer step on the next local batch; returns the loss.

        Without a plan: `members` (every peer in the job) split each chunk of the
        epoch equally (as seen when this peer starts the chunk), every peer takes
        `local_batch` samples, and `trainers` (the peers that train now, default:
        the members) make the global batch the LR is scaled for: a peer that is
        still starting adds no samples yet.

        With a DBS plan (over the members): this peer takes its planned batch b_i,
        chunks are split in proportion to the plan's shares, the global batch is
        Σb, and the LR is scaled by b_i / mean(b), so that unweighted averaging of
        the models gives the large-batch step on the union of the samples."""
        started = time.perf_counter()
        indices = self._next_indices(members, plan)
        if not indices:
            return math.nan
        if plan is not None:
            global_batch, scale = plan.total, plan.lr_scale(self.peer_id)
        else:
            global_batch, scale = self.spec.local_batch * (trainers or len(set(members))), 1.0
        self.lr = self._lr(global_batch) * scale
        for group in self.optimizer.param_groups:  # momentum buffers are kept as they are
            group["lr"] = self.lr
        value = self._accumulate(indices)
        compute = time.perf_counter() - started
        if self.slowdown > 1.0:  # emulate a slower device without using the CPU
            time.sleep((self.slowdown - 1.0) * compute)
        elapsed = time.perf_counter() - started
        self.compute_s += elapsed
        self.step_count += 1
        self.samples += len(indices)
        self.local_batch = len(indices)
        self.loss_ema = value if math.isnan(self.loss_ema) else 0.9 * self.loss_ema + 0.1 * value
        # A ratio of two EMAs (samples, seconds), not an EMA of per-step ratios: a
        # step that happened to be slow weighs by its time, so noise moves it less.
        self._ema_samples = 0.9 * self._ema_samples + 0.1 * len(indices)
        self._ema_seconds = 0.9 * self._ema_seconds + 0.1 * max(elapsed, 1e-9)
        self.speed_ema = self._ema_samples / self._ema_seconds
        return value

    def _accumulate(self, indices: Sequence[int]) -> float:
        """Gradient of the mean loss over `indices`, in micro-batches of at most
        max_local_batch, then one optimizer step; returns the mean loss."""
        micro = self.spec.max_local_batch or len(indices)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for start in range(0, len(indices), micro):
            x, y = self._to_device(_batch(self.train_set, indices[start : start + micro]))
            loss = nn.functional.cross_entropy(self.model(x), y, reduction="sum") / len(indices)
            loss.backward()
            total += loss.item()
        self.optimizer.step()
        return total

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
        if not all_finite(vector):
            raise ValueError("state holds non-finite values")
        self.flat.vector.copy_(vector[:n])
        self.momentum.copy_(vector[n:])
        self.step_count = step
        # Go on at the first chunk boundary at or after the donor's position: the
        # chunk under way may have been split without this peer, so reading in it
        # could read samples twice. If the others did count it (as a starting
        # member), its part of that chunk goes unread this epoch instead.
        self.epoch = int(progress)
        self._chunk = chunk_at(self._bounds, progress - self.epoch) - 1
        self._part, self._pos = [], 0


def _batch(dataset: Dataset, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(dataset, TensorDataset):
        index = torch.as_tensor(list(indices), dtype=torch.long)
        x, y = dataset.tensors
        return x[index], y[index]
    return default_collate([dataset[i] for i in indices])
