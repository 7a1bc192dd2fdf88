"""A script's LR scheduler, stepped in the unit the script declared
(docs/operations.md, "Script jobs": schedulers).

- "step": the script calls scheduler.step() after each of its optimizer steps,
  as it does alone; peer.step() adds the steps the other peers took meanwhile,
  so a schedule written for one process (T_max = epochs × steps per epoch)
  follows the job's position and ends with it, never past its end.
- "epoch": peerd steps it when the job's epoch advances, before the first
  optimizer step of the new epoch, so a StepLR written as `scheduler.step()`
  after each epoch decays at the job's epochs, whatever the number of peers
  (the loader runs to the job's end, so the script's own call after its loop
  comes once the job is done; one between its steps is refused).

The unit is never guessed: a scheduler given without one is refused at attach,
and a script whose calls contradict it is stopped at the first peer.step() that
shows it, before peerd has stepped the scheduler: stepped once per epoch by
peerd at every step, a StepLR(step_size=3) takes the LR to 1e-283 in a few
hundred steps. The script's own calls are counted from `last_epoch`, which each
step() raises by one, so nothing of the scheduler is wrapped (its state_dict,
which travels to newcomers, is its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from peerd.errors import ConfigError

INTERVALS = ("step", "epoch")


def check_scheduler(scheduler, interval: str | None) -> None:
    """At attach, before anything is joined: the unit declared, a scheduler peerd can step."""
    name = type(scheduler).__name__
    if interval not in INTERVALS:
        raise ConfigError(
            f"peerd.attach(scheduler={name}): say how your script steps it, with scheduler_interval="
            f"\"step\" (scheduler.step() after every optimizer step: OneCycleLR, a cosine over the "
            f"batches) or \"epoch\" (once per epoch: StepLR, MultiStepLR over epochs)"
            + ("" if interval is None else f"; got {interval!r}"))
    if "plateau" in name.lower() or not hasattr(scheduler, "last_epoch"):
        raise ConfigError(
            f"peerd.attach(scheduler={name}): peerd steps a scheduler to the job's position, which a "
            f"metric-driven one cannot follow; register it with state={{\"{name.lower()}\": scheduler}} "
            f"(it then travels to newcomers) and call its step(metric) after your own evaluation")


class ScriptScheduler:
    """Made once this peer holds the job's state (a newcomer's scheduler is at
    the job's position then), of a scheduler and unit check_scheduler passed."""

    def __init__(self, scheduler, interval: str, epochs: float) -> None:
        self.scheduler, self.interval = scheduler, interval
        self.last = math.ceil(epochs)  # "epoch": never past the job's epochs
        self._seen = scheduler.last_epoch  # after peerd's last move: what the script's calls add to
        self._first = True

    def at_batch(self, handed: Sequence) -> None:
        """The sampler handed out a batch (`handed`: those not trained yet). The
        next one to train, with none before it: a per-epoch schedule moves to its
        epoch now, before the script's optimizer step on it."""
        if self.interval == "epoch" and len(handed) == 1:
            self._step_to(min(handed[0].epoch, self.last))

    def at_step(self, progress: float, steps_per_epoch: float, end: int, handed: Sequence) -> None:
        """At peer.step(): check the script's calls since the last one, then move
        to the job's position (`progress` in epochs, `end` the schedule's last
        step; `handed`: batches handed out and not trained yet, prefetched)."""
        calls = self.scheduler.last_epoch - self._seen
        if self.interval == "step":
            if self._first and calls == 0:
                raise ConfigError(self._mismatch("does not call scheduler.step() after its optimizer step",
                                                 "scheduler_interval=\"epoch\""))
            self._step_to(min(int(progress * steps_per_epoch), end))
        else:
            if calls > 0:
                raise ConfigError(self._mismatch("calls scheduler.step() between its steps, and peerd steps "
                                                 "it at the job's epochs", "scheduler_interval=\"step\", or "
                                                 "call scheduler.step() only after the loader's loop"))
            if handed:
                self._step_to(min(handed[0].epoch, self.last))
        self._first = False

    def _step_to(self, target: int) -> None:
        while self.scheduler.last_epoch < target:
            self.scheduler.step()
        self._seen = self.scheduler.last_epoch

    def _mismatch(self, what: str, fix: str) -> str:
        name = type(self.scheduler).__name__
        return (f"peerd.attach(scheduler={name}, scheduler_interval=\"{self.interval}\"): your script {what}; "
                f"if that is how it steps the {name}, attach it with {fix}")
