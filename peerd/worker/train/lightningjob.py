"""The parts of peerd.lightning that need neither Lightning nor a daemon
(docs/operations.md, "Lightning"): what a Trainer must agree to, its epochs
over peerd's sampler, and the job's position in its counters.

- `TrainerSetup`, `Optimization` and `refusals`: the Trainer's settings that
  would train another job than the job file's (its length, more than one
  device, batches of its own choosing), refused before anything is joined.
- `EpochBatches`: the training loader's batch sampler. peerd's sampler hands
  out this peer's optimizer steps (the loader's batch × accumulate_grad_batches
  samples each, from the job's position); each is cut into the step's batches.
  A Lightning epoch is the job's epoch: it ends with the step that reaches
  the job's next epoch, so validation, epoch-interval schedulers and
  `current_epoch` keep their meaning. The loader has no length once the job's
  state is held: the Trainer then knows an epoch's last batch by reading one
  ahead, whatever share of the data this peer reads meanwhile.
- `position_steps`, `scheduler_target`: the job's position in one process's
  optimizer steps (the Trainer's `global_step`) and where each scheduler is
  at it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch.utils.data import Sampler

from peerd.errors import ConfigError
from peerd.worker.train.scriptsource import total_steps

INTERVALS = ("step", "epoch")


@dataclass(frozen=True)
class TrainerSetup:
    """What peerd reads of a Trainer at its setup, before the job is joined."""

    max_epochs: int
    max_steps: int
    single_device: bool  # one process on one device (SingleDeviceStrategy, one node)
    val_every_epoch: bool  # val_check_interval = 1.0: validation at each epoch's end
    whole_data: bool  # limit_train_batches 1.0, no overfit_batches, no fast_dev_run
    reload_every: int  # reload_dataloaders_every_n_epochs
    stoppers: tuple[str, ...] = ()  # what stops a Trainer by its own measure (EarlyStopping, max_time)
    accumulation_scheduled: bool = False  # a GradientAccumulationScheduler
    resumed: bool = False  # fit(ckpt_path=...)


@dataclass(frozen=True)
class Schedule:
    """One of the module's LR schedulers as Lightning steps it."""

    name: str
    interval: str
    frequency: int
    plateau: bool
    positional: bool  # a torch LRScheduler (last_epoch counts its steps)


@dataclass(frozen=True)
class Optimization:
    """What configure_optimizers gave, read at on_fit_start."""

    automatic: bool
    optimizers: int
    schedules: tuple[Schedule, ...] = ()


def refusals(setup: TrainerSetup, epochs: float, global_batch: int) -> list[str]:
    """What in `setup` cannot train the job of `epochs` (with DBS when
    `global_batch` > 0): each as the fix to make."""
    out = []
    if epochs != int(epochs):
        out.append(f"a Lightning epoch is a whole pass over the data: make [job] epochs ({epochs:g}) a whole number")
    elif setup.max_epochs != int(epochs):
        out.append(f"Trainer(max_epochs={setup.max_epochs}) must be the job's [job] epochs = {int(epochs)}: "
                   f"peerd trains the job's epochs, and the Trainer counts them (an unset max_epochs is 1000)")
    if setup.max_steps != -1:
        out.append(f"drop Trainer(max_steps={setup.max_steps}): the job's length is [job] epochs, and "
                   f"global_step is the job's position, not this peer's steps")
    if not setup.single_device:
        out.append("a peer is one process on one device: make the Trainer with devices=1 (peerd's averaging is "
                   "the only communication between peers)")
    if not setup.val_every_epoch:
        out.append("validation runs at the job's epoch ends: leave Trainer(val_check_interval) at 1.0 "
                   "(check_val_every_n_epoch works)")
    if not setup.whole_data:
        out.append("peerd's sampler reads the whole data set every epoch: drop limit_train_batches, "
                   "overfit_batches and fast_dev_run")
    if setup.reload_every:
        out.append("drop reload_dataloaders_every_n_epochs: peerd's sampler goes on across epochs")
    out += [f"drop {what}: a peer that stops by its own measure leaves the job before its end"
            for what in setup.stoppers]
    if setup.accumulation_scheduled:
        out.append("a GradientAccumulationScheduler changes a step's samples; give accumulate_grad_batches one value")
    if setup.resumed:
        out.append("drop fit(ckpt_path=...): peerd resumes the job itself (from the running peers or this "
                   "worker's checkpoint)")
    if global_batch > 0:
        out.append("the Trainer's batch is the training DataLoader's: set [job] global_batch = 0 "
                   "(no dynamic batch sizes)")
    return out


def optimization_refusals(opt: Optimization) -> list[str]:
    """What in configure_optimizers' result peerd cannot follow."""
    out = []
    if not opt.automatic:
        out.append("peerd counts the Trainer's optimizer steps: use automatic optimization")
    if opt.optimizers != 1:
        out.append(f"a peer averages one model trained by one optimizer; configure_optimizers gave {opt.optimizers}")
    for s in opt.schedules:
        if s.interval not in INTERVALS:
            out.append(f"{s.name}: interval {s.interval!r}; peerd follows \"step\" and \"epoch\"")
        elif not s.plateau and not s.positional:
            out.append(f"{s.name} is not a torch LRScheduler: peerd moves a schedule to the job's position by "
                       f"its last_epoch")
        elif s.interval == "step" and s.frequency != 1 and not s.plateau:
            out.append(f"{s.name}: a \"step\" schedule follows the job's steps one by one; drop frequency="
                       f"{s.frequency}")
    return out


def check(reasons: list[str]) -> None:
    if reasons:
        raise ConfigError("peerd.lightning: this Trainer cannot train the job as it is set up: "
                          + "; ".join(reasons))


@dataclass(frozen=True)
class StepScale:
    """One process's optimizer steps over the job: `samples` per epoch at `step_batch` each."""

    epochs: float
    samples: int
    step_batch: int

    @property
    def per_epoch(self) -> float:
        return self.samples / self.step_batch

    @property
    def total(self) -> int:
        return total_steps(self.epochs, self.samples, self.step_batch)

    def position_steps(self, progress: float) -> int:
        """The steps one process takes to the job's position `progress` (epochs
        done): the Trainer's global_step, never past the job's steps."""
        return min(math.floor(round(progress * self.per_epoch, 6)), self.total)


def scheduler_target(schedule: Schedule, epoch: int, steps: int, limit: int | None = None) -> int | None:
    """Where a scheduler's last_epoch is at the job's `epoch` (Lightning steps
    an "epoch" schedule at the end of every `frequency`-th epoch) or after its
    `steps` (one per step, never past a OneCycleLR's `limit`); None for one
    peerd leaves to Lightning (ReduceLROnPlateau, on this peer's own metric)."""
    if schedule.plateau:
        return None
    if schedule.interval == "epoch":
        return epoch // schedule.frequency
    return steps if limit is None else min(steps, limit)


def split(indices: list[int], parts: int) -> list[list[int]]:
    """One optimizer step's samples as `parts` batches, as even as they go (the
    job's short last step too); none empty."""
    n = len(indices)
    cuts = [k * n // parts for k in range(parts + 1)]
    return [indices[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


class EpochBatches(Sampler[list[int]]):
    """The Trainer's training batch sampler over peerd's (the module's
    docstring says how). Made before the job is joined when the Trainer asks
    for the loader early (estimated_stepping_batches in configure_optimizers):
    then it has one process's length and no batch; `bind` feeds it peerd's
    sampler once this peer holds the job's state."""

    def __init__(self, samples: int, batch: int, accumulation: int) -> None:
        self.samples, self.batch, self.accumulation = samples, batch, accumulation
        self.source = None  # peerd's sampler (peer.loader's), once bound
        self.trained = 0  # this epoch's batches the Trainer took (set at each on_train_batch_start)
        self.step_sizes: deque[int] = deque()  # samples of each step handed out and not yet stepped
        self._steps: Iterator[list[int]] | None = None  # one pass over peerd's sampler for the whole job
        self._stop: Callable[[], bool] = lambda: False
        self._handed: list[list[int]] = []  # this epoch's batches handed out
        self._end: int | None = None  # the job's epoch this Lightning epoch ends at
        self._over = False  # this epoch's last batch is handed out
        self.origin: float | None = None  # the job's position this peer's reading starts at (its first batch)

    @property
    def step_batch(self) -> int:
        return self.batch * self.accumulation

    @property
    def epoch(self) -> int | None:
        """The job's epoch of the Lightning epoch under way (None before a batch was asked for)."""
        return None if self._end is None else self._end - 1

    def bind(self, source, stop: Callable[[], bool]) -> None:
        """peerd's sampler of this peer's steps; `stop`: this peer left."""
        self.source, self._stop = source, stop
        self._steps = iter(source)

    def __len__(self) -> int:
        """Before the job is joined, one process's batches per epoch: what the
        Trainer's estimated_stepping_batches counts (a schedule written for
        one process, which peerd moves along the job's position). Bound, none:
        a peer's batches per epoch change with the peers."""
        if self.source is None:
            return math.ceil(self.samples / self.batch)
        raise TypeError("peerd's training loader has no length: a peer's share of an epoch changes as peers "
                        "join and leave")

    def __iter__(self) -> Iterator[list[int]]:
        """This epoch's batches: first those handed out to an iterator the
        Trainer dropped before training on them (it makes the loader's
        iterator anew at an epoch's start), then new steps until the job's
        epoch ends here. Once every batch of an epoch was trained, the next
        iterator starts the next epoch."""
        if self.source is None:
            return
        if self._over and self.trained >= len(self._handed):
            self._handed, self.trained, self._over = [], 0, False
            self._end = None if self._end is None else self._end + 1
        yield from self._handed[self.trained:]
        if not self._over:
            yield from self._new_steps()

    def _new_steps(self) -> Iterator[list[int]]:
        cursor = getattr(self.source, "cursor", None)
        if cursor is None:  # the job was over here, or this peer stopped, before its loader was made
            self._over = True
            return
        if self._end is None:  # a newcomer's cursor is at the chunk boundary after the state it took
            self.origin = cursor.progress
            self._end = math.floor(self.origin) + 1
        while cursor.progress < self._end and not self._stop():
            indices = next(self._steps, None)
            if indices is None:
                break
            parts = split(indices, self.accumulation)
            self.step_sizes.append(len(indices))
            self._handed.extend(parts)
            yield from parts
        self._over = True
