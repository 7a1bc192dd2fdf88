"""Whether a worker's training has collapsed (docs/algorithms.md, "When training
collapses"), from what the worker sees of it: each step's training loss and each
evaluation of the job's metric. The first rule that holds decides (`Limits`
holds the thresholds):

- **non-finite loss**: `nonfinite_steps` (3) steps in a row whose loss is NaN or
  ±inf (a loss never finite counts the same). One such step is a skipped step,
  counted as such; three in a row is a model that no longer computes a loss.
- **loss rise**: the median of the last `window` (50) finite step losses stays
  above `rise` (3) × the best such median for `sustain` (50) steps in a row,
  having given back at least `give_back` (half) of what it had learned (median −
  best ≥ ½ (first − best), `first` the first full window's). The median shrugs
  off a few hard batches; the give-back keeps a tiny loss that wobbles (0.002
  after a best of 0.0006) from counting. Off while the best is ≤ 0.
- **loss blow-up**: the same median is above `blowup` (10) × the loss of the job's
  first step (the initial model's, when this watch saw step 1): half the last
  `window` steps or more that far above where the job started. A loss that
  exploded at the first updates (an absurd LR) has no better window to rise
  from, and under gossip it may fall back towards chance within a hundred steps
  while the model stays useless, so the window is all the sustain it gets.
- **metric at chance** (with the job's `[job] chance` c only): once the metric was
  `clear` (½) × |c| better than c, it is back within `near` (a tenth) of that best
  gain from c, or worse, or NaN, at `metric_evals` (2) evaluations in a row.
- **never learned** (at the job's end, with c only): the metric was never `clear`
  of c, and the loss, over at least two windows of steps from the job's first,
  never fell `learned` (a tenth) below that first step's: a model whose units
  died at the first updates sits at chance with its initial loss to the end. At
  the end only: a job may well sit at its initial loss for a while and then learn.

Sticky: once collapsed, a watch (one worker process) stays so, whatever follows.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

NONFINITE = "non-finite loss"
LOSS_RISE = "loss rise"
BLOWUP = "loss blow-up"
AT_CHANCE = "metric at chance"
NEVER_LEARNED = "never learned"


@dataclass(frozen=True)
class Limits:
    """The rules' thresholds; the defaults are the ones peerd uses (docs/algorithms.md)."""

    nonfinite_steps: int = 3
    window: int = 50  # finite step losses in the median
    rise: float = 3.0
    give_back: float = 0.5
    sustain: int = 50  # steps in a row above the rise
    blowup: float = 10.0  # × the first step's loss
    clear: float = 0.5  # × |chance|: the gain that arms the metric rule
    near: float = 0.1  # × the best gain: what counts as back at chance
    metric_evals: int = 2  # evaluations in a row at chance
    learned: float = 0.1  # the end: a loss that never fell this share below the first step's never learned


@dataclass(frozen=True)
class Collapse:
    rule: str  # NONFINITE, LOSS_RISE, BLOWUP, AT_CHANCE or NEVER_LEARNED
    step: int  # the local step (or, for the metric, the step count at the evaluation) it was seen at
    detail: str  # the values: "loss 2.3 (best 0.21) for 50 steps"


def describe(collapse: Collapse, round_: int) -> str:
    """The one sentence every place that shows a collapse uses."""
    return f"training collapsed at round {round_} ({collapse.rule}): {collapse.detail}"


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class Health:
    """The watch over one worker's training. `higher_better`: the job's
    metric_mode is "max"; `chance`: the job's [job] chance (None: no metric rule)."""

    def __init__(self, metric: str = "metric", higher_better: bool = True, chance: float | None = None,
                 limits: Limits = Limits()) -> None:
        if chance is not None and (not math.isfinite(chance) or chance == 0):
            raise ValueError(f"chance must be a finite number other than 0, got {chance}")
        self.metric_name = metric
        self.higher_better = higher_better
        self.chance = chance
        self.limits = limits
        self.collapse: Collapse | None = None
        self._nonfinite = 0  # non-finite losses in a row
        self._recent: deque[float] = deque(maxlen=limits.window)
        self._first = math.nan  # the first full window's median
        self._best = math.inf  # the best median
        self._risen = 0  # steps in a row above the rise
        self._initial = math.nan  # the loss of the job's first step (step 1), when seen here
        self._since_initial = 0  # finite losses seen from that step on
        self._best_gain = -math.inf  # the metric's best distance from chance, in the better direction
        self._at_chance = 0  # evaluations in a row back at chance
        self._evaluated = False

    def loss(self, value: float, step: int) -> Collapse | None:
        """One step's training loss; the collapse it makes, if it makes one."""
        if self.collapse is not None:
            return None
        if not math.isfinite(value):
            self._nonfinite += 1
            if self._nonfinite < self.limits.nonfinite_steps:
                return None
            never = " (never finite)" if not self._recent else ""
            return self._fire(NONFINITE, step, f"loss {value} for {self._nonfinite} steps in a row{never}")
        self._nonfinite = 0
        if step == 1:
            self._initial = value
        self._since_initial += self._initial > 0
        self._recent.append(value)
        if len(self._recent) < self.limits.window:
            return None
        median, lim = _median(self._recent), self.limits
        if math.isnan(self._first):
            self._first = median
        self._best = min(self._best, median)
        self._risen = self._risen + 1 if self._rising(median) else 0
        if self._risen >= lim.sustain:
            return self._fire(LOSS_RISE, step, f"loss {median:.3g} (best {self._best:.3g}) for {self._risen} steps")
        if self._initial > 0 and median > lim.blowup * self._initial:
            return self._fire(BLOWUP, step, f"loss {median:.3g} (first step {self._initial:.3g}) "
                                            f"over the last {lim.window} steps")
        return None

    def _rising(self, median: float) -> bool:
        best, lim = self._best, self.limits
        return best > 0 and median > lim.rise * best and median - best >= lim.give_back * (self._first - best)

    def metric(self, value: float, step: int) -> Collapse | None:
        """One evaluation of the job's metric; the collapse it makes, if it makes one."""
        if self.collapse is not None or self.chance is None:
            return None
        c = self.chance
        gain = (value - c if self.higher_better else c - value) if not math.isnan(value) else -math.inf
        self._best_gain = max(self._best_gain, gain)
        self._evaluated = True
        if self._best_gain < self.limits.clear * abs(c):
            return None  # never clearly better than chance: nothing to fall back from
        back = gain <= self.limits.near * self._best_gain
        self._at_chance = self._at_chance + 1 if back else 0
        if self._at_chance < self.limits.metric_evals:
            return None
        best = c + self._best_gain if self.higher_better else c - self._best_gain
        return self._fire(AT_CHANCE, step, f"{self.metric_name} {value:.4g} at chance {c:g} after {best:.4g}")

    def end(self, step: int) -> Collapse | None:
        """The job's end here, after its last evaluation: the collapse of a job that
        never learned, if it is one."""
        if self.collapse is not None or self.chance is None or not self._evaluated:
            return None
        lim, c = self.limits, self.chance
        if self._best_gain >= lim.clear * abs(c) or self._since_initial < 2 * lim.window:
            return None  # it learned, or too few steps seen from the first to say
        if self._best < (1 - lim.learned) * self._initial:
            return None
        best = c + self._best_gain if self.higher_better else c - self._best_gain
        return self._fire(NEVER_LEARNED, step, f"{self.metric_name} never beyond {best:.4g} at chance {c:g}; "
                                               f"loss never below {self._best:.3g} (first step {self._initial:.3g})")

    def _fire(self, rule: str, step: int, detail: str) -> Collapse:
        self.collapse = Collapse(rule, step, detail)
        return self.collapse
