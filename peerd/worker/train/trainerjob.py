"""The parts of peerd.transformers that need neither transformers nor a
daemon (docs/operations.md, "Hugging Face Trainer"): how a Trainer's steps,
epochs and batches map onto the job's position.

- `check_length`: the Trainer's `num_train_epochs` or `max_steps` and the job's
  `[job] epochs` must describe the same job, or the script stops before attach.
- `JobBatches`: the Trainer's batch sampler. peerd's sampler hands out this
  peer's optimizer steps (per-device batch × gradient_accumulation_steps
  samples each, from the job's position); each is cut into the step's
  micro-batches. A Trainer that counts epochs ends each with the job's epoch,
  so `on_epoch_end` (eval_strategy="epoch") comes at the job's epochs.
- `job_step`: the Trainer's `global_step` is the job's position in the steps
  one process takes (the unit of `max_steps` and of the LR schedule), so a
  schedule written for one process ends with the job, whoever joins.
- `due`: which of the Trainer's step intervals (logging, eval, save) that
  position passed: with several peers it moves by more than one per step.
- `TrainerStateOf`: the TrainerState's position as a registered object, so
  newcomers and checkpoints carry it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch
from torch.utils.data import Sampler

from peerd.errors import ConfigError
from peerd.worker.train.scriptsource import total_steps

# What an evaluation returns that is not a measure of the model.
_NOT_METRICS = ("epoch", "_runtime", "_per_second")


def check_length(epochs: float, num_train_epochs: float, max_steps: int, samples: int, step_batch: int) -> None:
    """Refuse a Trainer whose length is not the job's: `max_steps` (> 0) must be
    the optimizer steps one process takes over the job's `epochs` of `samples`
    at `step_batch` samples per step (peerd.total_steps), else
    `num_train_epochs` must equal `epochs`."""
    if max_steps > 0:
        steps = total_steps(epochs, samples, step_batch)
        if steps != max_steps:
            fit = math.floor(max_steps * step_batch / samples * 1e6) / 1e6
            raise ConfigError(
                f"peerd.transformers: TrainingArguments(max_steps={max_steps}) does not match the job: "
                f"[job] epochs = {epochs:g} over {samples} samples at {step_batch} samples per optimizer step "
                f"(per_device_train_batch_size × gradient_accumulation_steps) is {steps} steps; "
                f"set [job] epochs = {fit:g} or max_steps = {steps}")
    elif not math.isclose(num_train_epochs, epochs, rel_tol=1e-9, abs_tol=1e-12):
        raise ConfigError(
            f"peerd.transformers: TrainingArguments(num_train_epochs={num_train_epochs:g}) and the job's "
            f"[job] epochs = {epochs:g} differ: peerd trains the job's epochs and the Trainer lays its LR "
            f"schedule over its own; make them equal")


def job_step(progress: float, epochs: float, max_steps: int, last: int, done: bool) -> int:
    """The Trainer's global_step after a step of this peer: the job's position
    (`progress`, epochs done) in one process's steps, never behind `last` + 1
    (every step has its own number) and reaching `max_steps` only once the job
    is `done` here."""
    if done:
        return max(last, max_steps)
    at = math.floor(round(progress / epochs * max_steps, 6)) if epochs > 0 else last  # 57.99999 is 58
    return max(last, min(max(last + 1, at), max_steps - 1))


def due(last: int, now: int, every: Mapping[str, int]) -> list[str]:
    """The intervals of `every` (name → steps, 0: off) that a move of the
    global_step from `last` to `now` passed: their multiple is in (last, now]."""
    return [name for name, steps in every.items() if steps > 0 and now // steps > last // steps]


def model_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """An evaluation's numbers about the model (`eval_loss`, ...), without its
    run time, speed and the epoch it was taken at."""
    return {str(k): float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not any(str(k).endswith(s) for s in _NOT_METRICS)}


def rows(inputs: object) -> int | None:
    """The samples in one of the Trainer's batches: the leading size of its
    `input_ids` (or first tensor); None when it holds no tensor."""
    if isinstance(inputs, Mapping):
        first = inputs.get("input_ids")
        values = [first, *inputs.values()]
    elif isinstance(inputs, (tuple, list)):
        values = list(inputs)
    else:
        values = [inputs]
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def split(indices: list[int], parts: int) -> list[list[int]]:
    """One optimizer step's samples as `parts` micro-batches, as even as they
    go (the job's short last step too); none empty."""
    n = len(indices)
    cuts = [k * n // parts for k in range(parts + 1)]
    return [indices[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


class JobBatches(Sampler[list[int]]):
    """The Trainer's batch sampler over peerd's: made before peerd.attach (the
    Trainer sizes its schedule from len()), fed once this peer holds the job's
    state (`start`)."""

    def __init__(self, samples: int, batch: int, accumulation: int, by_epoch: bool = True) -> None:
        self.samples, self.batch, self.accumulation = samples, batch, accumulation
        # A Trainer of max_steps runs ceil(max_steps / steps per epoch) epochs of its own,
        # fewer than the job's when a step's samples do not divide the data: no cut then.
        self.by_epoch = by_epoch
        self.source = None  # peerd's sampler (peer.loader's), once attached

    @property
    def step_batch(self) -> int:
        return self.batch * self.accumulation

    def start(self, sampler) -> None:
        self.source = sampler

    def __len__(self) -> int:
        """One process's micro-batches per epoch, in whole optimizer steps: the
        Trainer's step arithmetic (max_steps, the schedule's length) as alone."""
        steps = math.ceil(math.ceil(self.samples / self.batch) / self.accumulation)
        return steps * self.accumulation

    def __iter__(self) -> Iterator[list[int]]:
        """The micro-batches of this peer's steps to the end of the job's epoch
        under way (the step that crosses it included; `by_epoch`), at most one
        of the Trainer's epochs of them: its loop ends the epoch there, so a
        batch handed out (and read ahead by DataLoader workers) is one it trains.
        The Trainer's next epoch goes on where this one stopped."""
        if self.source is None:
            raise ConfigError("peerd.transformers: the training data was read before the Trainer joined the job")
        cursor = getattr(self.source, "cursor", None)
        if cursor is None:  # the job was over here when this peer joined: nothing to train
            return
        end = math.floor(cursor.progress) + 1 if self.by_epoch else math.inf
        left = len(self)
        for indices in self.source:
            yield from split(indices, self.accumulation)
            left -= self.accumulation
            if left <= 0 or cursor.progress >= end:
                return


class TrainerStateOf:
    """The position in a Trainer's TrainerState (global_step, epoch) as an
    object peerd.attach registers: it travels to newcomers and into
    checkpoints with the model, optimizer and scheduler. Read from the Trainer
    each time: the Trainer makes a new TrainerState at every train()."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict:
        state = self.trainer.state
        return {"global_step": int(state.global_step), "epoch": float(state.epoch or 0.0)}

    def load_state_dict(self, saved: dict) -> None:
        state = self.trainer.state
        state.global_step, state.epoch = int(saved["global_step"]), float(saved["epoch"])
