"""The local half of a worker: model, optimizer, its parts of the data, one step at a time.

Blocking torch code; the worker runs it in a thread so that its event loop keeps
serving partners while it computes. The job's own code (model, data, loss,
evaluation, optimizer) comes from its job module (peerd.worker.train.jobmodule); the
whole training state is registered in a TrainState.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from peerd.core.health import Health
from peerd.core.meter import StepMeter
from peerd.core.rng import derive_seed
from peerd.core.schedule import schedule_factor
from peerd.core.shares import BatchPlan
from peerd.core.slowdown import Slowdown
from peerd.errors import ConfigError
from peerd.settings.jobspec import JobSpec
from peerd.worker.train.data import DataCursor, PeerSampler, View, default_loader, eval_loader
from peerd.worker.train.device import resolve_device
from peerd.worker.train.jobmodule import JobCode, JobContext
from peerd.worker.train.localdata import LocalData
from peerd.worker.train.modes import in_eval_mode, modes_kept
from peerd.worker.train.lrcontrol import LrControl
from peerd.worker.state.modelfile import model_state, save_model, write_model
from peerd.worker.train.optim import build_optimizer
from peerd.worker.train.precision import Precision
from peerd.worker.train.slowdown import SlowedSteps
from peerd.worker.state.trainstate import TrainState

# resolve_device and the model-file helpers live in their own modules; still importable from here.
__all__ = ["Trainer", "init_seed", "model_state", "resolve_device", "save_model", "to_device", "write_model"]

log = logging.getLogger("peerd.worker")

EVAL_BATCH = 500
# On a GPU the fixed part of a step is timed between two synchronisations (the
# backward's kernels would otherwise land in it), which costs the overlap of the
# optimizer update with the next step's start: only every this many steps.
CUDA_SPLIT_EVERY = 4


def init_seed(spec: JobSpec, peer_id: str) -> int:
    """The seed of the initial model: shared by the job, or this peer's own."""
    if spec.init == "shared":
        return spec.seed
    return int.from_bytes(derive_seed(spec.seed, peer_id)[:8], "little")


def _say_what_is_kept(model: nn.Module, where: str) -> None:
    """Log what peerd's loop keeps as make_model left it and what it changes
    (docs/operations.md, "What peerd's own loop does to the model")."""
    frozen = in_eval_mode(model)
    if frozen:
        log.info("%s: module(s) %s in eval mode: trained in it, buffers kept as they are", where,
                 ", ".join(frozen))
    fixed = sum(1 for p in model.parameters() if not p.requires_grad)
    if fixed:
        log.info("%s: %d parameter(s) with requires_grad=False: not trained, not averaged", where, fixed)
    cast = sorted({str(t.dtype) for t in (*model.parameters(), *model.buffers())
                   if t.is_floating_point() and t.dtype != torch.float32})
    if cast:
        log.info("%s: %s tensors cast to fp32 (peerd trains and averages fp32; [train] precision for autocast)",
                 where, ", ".join(cast))


def to_device(batch, device: torch.device, non_blocking: bool = False):
    """Every tensor of a (nested) batch on `device`."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


class Trainer:
    def __init__(
        self, spec: JobSpec, peer_id: str, spec_dir: str = "", slowdown: float = 1.0, device: str = "cpu",
        data_root: str = "", slowdown_clock: str = "wall", step_overhead_s: float = 0.0,
    ) -> None:
        try:
            self.slowed = SlowedSteps(Slowdown(slowdown, slowdown_clock, step_overhead_s))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.spec = spec
        self.peer_id = peer_id
        self.slowdown = slowdown  # testing knob: sleep (slowdown − 1) × each step's time (self.slowed)
        self.device = resolve_device(device)
        self.data_root = data_root  # data_mode = "local": where this peer's data is (ctx.data_root)
        self.code = JobCode(spec, spec_dir)
        self.model, self.train_set, self.test_set = self._build()
        self.precision = Precision(spec.train.precision, self.device, spec.train.grad_clip_norm)
        self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], spec.optimizer,
                                         self.code.make_optimizer, f"{self.code.where}.")
        objects = {"scaler": self.precision.scaler} if self.precision.scaler is not None else {}
        # local mode: this peer's own data set, the members' sizes and its LR weight
        self.local = LocalData(spec, peer_id, len(self.train_set)) if spec.data_mode == "local" else None
        if self.local is not None:  # the job's clock travels with the state (newcomers, checkpoints)
            objects["clock"] = self.local.cursor.clock
        self.state = TrainState(self.model, self.optimizer, average_buffers=spec.gossip.average_buffers,
                                average_optimizer_state=spec.gossip.average_optimizer_state, objects=objects,
                                outer=spec.outer.enabled)
        self.flat = self.state.flat
        self.cursor = self.local.cursor if self.local else DataCursor(spec, peer_id, len(self.train_set))
        self.view = View()
        self._loader_iter = None  # made at the first step: a newcomer seeks first
        self._sampler: PeerSampler | None = None
        self.progress = 0.0  # epochs done, fractional, by the batches trained on
        self.step_count = 0
        self.samples = 0
        self.last_indices: list[int] = []  # the samples of the last step
        self.skipped_steps = 0  # non-finite loss or overflowing gradients: not applied
        self.ended_elsewhere = False  # Source.ended_elsewhere
        self.extras: dict[str, float] = {}  # the loss function's extra scalars, last step
        self.meter = StepMeter()  # loss, speed and fixed cost (with the slowdown's sleep), no network wait
        self.health = Health(spec.metric, spec.metric_mode == "max", spec.chance)  # the collapse watch
        self._fixed_work = math.nan  # the last step's optimizer update etc., timed apart (NaN: not this step)
        self.local_batch = spec.local_batch  # of the last step
        self.share = math.nan  # this peer's part of the current chunk's data (DBS), NaN when equal
        self.compute_s = 0.0  # total time in steps, the slowdown's sleep included
        self.lr_control = LrControl(spec.optimizer)
        self.lr_control.install(self.optimizer)
        self.lr = math.nan
        self._check_job_code()

    def _build(self) -> tuple[nn.Module, object, object]:
        """The job's model (on the CPU with the job's seed, so every device type
        gets the same one) and data sets."""
        torch.manual_seed(init_seed(self.spec, self.peer_id))
        try:
            model = self.code.make_model()
        except ConfigError:
            raise
        except Exception as exc:  # the job's own code: it will fail the same way on a restart
            raise ConfigError(f"{self.code.name('make_model')} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module):
            raise ConfigError(f"{self.code.name('make_model')} returned {type(model).__name__}; expected a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(f"{self.code.name('make_model')}: the model has no trainable parameters")
        _say_what_is_kept(model, self.code.name("make_model"))
        model = model.float().to(self.device)
        try:
            sets = self.code.datasets(self.context())
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{self.code.name('make_datasets')} failed: {type(exc).__name__}: {exc}") from exc
        if not (isinstance(sets, (tuple, list)) and len(sets) == 2 and all(hasattr(s, "__len__") for s in sets)):
            raise ConfigError(f"{self.code.name('make_datasets')} returned {type(sets).__name__}; "
                              "expected (train, test): two map-style datasets")
        if len(sets[0]) == 0 or len(sets[1]) == 0:
            raise ConfigError(f"{self.code.name('make_datasets')} returned an empty training or test set")
        return model, sets[0], sets[1]

    def _check_job_code(self) -> None:
        """Run the job's loss on two training samples and its evaluation on two
        test samples, so that a job module returning the wrong thing fails at
        join, before any training, naming the callable. In eval mode: nothing
        of the model (BatchNorm statistics) changes."""
        batch = to_device(next(iter(eval_loader(self.train_set, 2))), self.device)
        with modes_kept(self.model):
            self.model.eval()
            with self.precision.autocast():
                loss, _ = self._call("loss", lambda: self.code.loss(self.model, batch))
            del loss
            first = to_device(next(iter(eval_loader(self.test_set, 2))), self.device)
            with torch.no_grad(), self.precision.autocast():
                self._call("evaluate", lambda: self.code.evaluate(self.model, [first]))
        self.model.zero_grad(set_to_none=True)

    def _call(self, name: str, fn):
        try:
            return fn()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{self.code.name(name)} failed: {type(exc).__name__}: {exc}") from exc

    @property
    def epoch(self) -> int:
        return int(self.progress)

    @property
    def loss_ema(self) -> float:
        return self.meter.loss

    @property
    def speed_ema(self) -> float:
        return self.meter.speed

    @property
    def ramp(self):
        return self.lr_control.ramp

    @property
    def global_batch(self) -> int:
        """The global batch the LR is scaled for."""
        return self.lr_control.ramp.batch

    @property
    def done(self) -> bool:
        return self.progress >= self.spec.epochs or self.ended_elsewhere

    def context(self) -> JobContext:
        d = self.spec.data_loading
        return JobContext(self.peer_id, self.device, self.spec.local_batch, self.spec.seed, self.data_root,
                          loader_workers=d.loader_workers, pin_memory=d.pin_memory and self.device.type == "cuda",
                          prefetch_factor=d.prefetch_factor)

    def _loader(self):
        """The training batches: the job's make_loader over peerd's sampler, or
        peerd's DataLoader."""
        def size(view: View) -> int:
            return view.plan.batch(self.peer_id) if view.plan is not None else self.spec.local_batch

        self._sampler = PeerSampler(self.cursor, self.view, size, self.spec.max_local_batch)
        ctx = self.context()
        if self.code.make_loader is not None:
            loader = self._call("make_loader", lambda: self.code.make_loader(self.train_set, self._sampler, ctx))
        else:
            loader = default_loader(self.train_set, self._sampler, ctx.loader_workers, ctx.pin_memory,
                                    ctx.prefetch_factor)
        return iter(loader)

    def _set_lr(self, global_batch: int, batch_scale: float) -> None:
        """The job's schedule sets the base LR; peerd's multiplier (scaling with
        the global batch, its ramp, the DBS share) is applied around the step."""
        opt = self.spec.optimizer
        base = opt.lr * schedule_factor(opt.schedule, self.progress / self.spec.epochs, self.step_count,
                                        opt.warmup_steps)
        for group in self.optimizer.param_groups:  # optimizer state is kept as it is
            group["lr"] = base
        self.lr = base * self.lr_control.update(global_batch, self.step_count, batch_scale)

    def step(self, members: Sequence[str], trainers: int = 0, plan: BatchPlan | None = None) -> float:
        """One optimizer step on the next local batch; returns the loss (NaN
        when the data is done or the step was skipped).

        Without a plan: `members` (the peers that serve the job, this one
        included; one still starting is not among them) split each chunk of the
        epoch equally (as seen when this peer starts the chunk), every peer takes
        `local_batch` samples, and `trainers` peers make the global batch the LR
        is scaled for (default, and what the engine's StepPlan gives: the
        number of members).

        With a DBS plan (over the members): this peer takes its planned batch b_i,
        chunks are split in proportion to the plan's shares, the global batch is
        Σb, and the LR is scaled by b_i / mean(b), so that unweighted averaging of
        the models gives the large-batch step on the union of the samples."""
        self.slowed.start()
        self.view.members, self.view.plan = members, plan
        if plan is not None:
            global_batch = plan.total
        else:
            global_batch = self.spec.local_batch * (trainers or len(set(members)))
        if self.local is not None:  # before the loader: its workers read ahead at once
            self.local.plan_step(members, global_batch)
        if self._loader_iter is None:
            self._loader_iter = self._loader()
        value, size = self._accumulate(global_batch, plan)
        if size == 0:
            return math.nan
        elapsed = self.slowed.finish()  # the slowdown's sleep included
        fixed = self.slowed.fixed_s(self._fixed_work) if math.isfinite(self._fixed_work) else math.nan
        self.compute_s += elapsed
        self.step_count += 1
        self.samples += size
        self.local_batch = size
        self.meter.observe(size, elapsed, value, fixed)
        self.health.loss(value, self.step_count)  # NaN: a non-finite loss (a step with data)
        return value

    def _accumulate(self, global_batch: int, plan: BatchPlan | None) -> tuple[float, int]:
        """Gradient of the mean loss over one step's micro-batches, then one
        optimizer step; returns (mean loss, samples). A non-finite loss or
        gradient skips the optimizer step (counted), never the round.

        Times the part of the step no batch changes (clearing the gradients,
        unscaling, clipping, the optimizer update) into self._fixed_work, for
        DBS's step model; the rest (reading, forward, backward) grows with the batch."""
        timed = self.device.type != "cuda" or self.step_count % CUDA_SPLIT_EVERY == 0
        self._fixed_work = math.nan
        t0 = time.perf_counter()  # in the modes make_model left (a module in eval mode stays so)
        self.optimizer.zero_grad(set_to_none=True)
        fixed = time.perf_counter() - t0
        total, size, finite = 0.0, 0, True
        read: list[int] = []
        extras: dict[str, float] = {}
        while True:
            try:
                batch = next(self._loader_iter)
            except StopIteration:  # the job's data is read (a dropped last batch moved the cursor too)
                self.progress = max(self.progress, self.cursor.progress)
                break
            micro = self._sampler.handed.popleft()
            if size == 0:  # the LR of this step: this peer's batch from the plan as it was handed out
                self._set_lr(global_batch, self._lr_weight(micro, plan))
            batch = to_device(batch, self.device, non_blocking=True)
            with self.precision.autocast():
                loss, extra = self.code.loss(self.model, batch)
            weight = len(micro.indices) / micro.step_size
            value = float(loss.detach())
            finite = finite and math.isfinite(value)
            if finite:
                self.precision.backward(loss * weight)
            total += value * weight
            for k, v in extra.items():
                extras[k] = extras.get(k, 0.0) + v * weight
            size += len(micro.indices)
            read += micro.indices
            self.progress, self.share = micro.progress, micro.share
            if micro.last:
                break
        if size == 0:
            return math.nan, 0
        t1 = self._sync_clock(timed)
        stepped = finite and self.precision.step(self.optimizer, self.state.params)
        if not stepped:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        if timed:
            self._fixed_work = fixed + self._sync_clock(timed) - t1
        if not stepped:
            log.warning("step %d skipped: %s (%d skipped so far)", self.step_count,
                        "non-finite loss" if not finite else "non-finite gradients", self.skipped_steps)
        self.extras = extras
        self.last_indices = read
        return (total if finite else math.nan), size

    def _sync_clock(self, timed: bool) -> float:
        """perf_counter, after the GPU's queued work when this step is timed."""
        if timed and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _lr_weight(self, micro, plan: BatchPlan | None) -> float:
        """This peer's LR multiplier. Shared data: b_i / mean(b) under a DBS plan
        (the large-batch step on the union of the samples), else 1. Local data:
        its data weight (peerd.core.weighting), whatever its batch."""
        if self.local is not None:
            return self.local.weight
        return micro.step_size / plan.mean if plan is not None else 1.0

    def set_data_sizes(self, sizes: dict[str, int], terms: dict[str, float] | None = None) -> None:
        """local mode: the peers this one averages with, their published data set
        sizes (for the weights and the union), and the peers' terms of the job's
        clock (peerd.core.unionclock); by default every member."""
        if self.local is not None:
            self.local.set_sizes(sizes)
            self.progress = max(self.progress, self.local.observe(terms or {}))

    @property
    def epochs_read(self) -> float:
        """local mode: this peer's term of the job's clock (published); 0 otherwise."""
        return self.local.cursor.clock.own if self.local is not None else 0.0

    @property
    def data_samples(self) -> int:
        """local mode: how many training samples this peer holds (published to the others); 0 otherwise."""
        return self.local.samples if self.local is not None else 0

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The job's metrics on the test set, in eval mode; each module's own mode after."""
        batches = (to_device(b, self.device, non_blocking=True) for b in eval_loader(self.test_set, EVAL_BATCH))
        with modes_kept(self.model), self.precision.autocast():
            self.model.eval()
            return self.code.evaluate(self.model, batches)

    def save(self, path: Path, **meta: object) -> None:
        save_model(self.model, path, job=self.spec.name, step=self.step_count, progress=self.progress,
                   metric=self.spec.metric, **meta)

    def adopt_state(self, vector: torch.Tensor, extra: bytes, step: int, progress: float) -> None:
        """Continue from a donor's state: everything registered, the step count
        and the position in the data and the LR schedule."""
        self.state.adopt(vector, extra)
        self.step_count = step
        self.cursor.seek(progress)
        self.progress = self.cursor.progress
        self._loader_iter = None

    def close(self) -> None:
        """Stop the loader's worker processes."""
        self._loader_iter = None
