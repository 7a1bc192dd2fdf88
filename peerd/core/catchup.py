"""Stepping up to a partner's round (docs/architecture.md, "The path of one
gossip round", step 10).

A partner that refused a round it no longer holds says which round it is in.
A worker behind it continues from the round before, so that its next round is
the partner's, and keeps its own model: being ahead in rounds says nothing
about being right. A peer cut off by a partition races ahead in rounds (nobody
to wait for) on a model that diverged; taking the state of whoever is ahead
after the heal spread that model to every peer and sent the job to chance
accuracy (found by peerd soak). Gossip merges the models from there on.

A worker that has exchanged with nobody since it came into the job holds
nothing of its own: a copy of its donors' state (or its checkpoint) and a few
steps. Far behind its partner (its donors trained on alone until their daemons
told them of it), keeping that copy would halve the donors' progress in the
first average and leave its data position behind theirs, so that it ends the
job rounds after them, training alone. It takes the state again instead:
model and data position (docs/algorithms.md, "Joining a running job").
"""

from __future__ import annotations

from dataclasses import dataclass

STEP_UP_LOG_ROUNDS = 10  # a step up over more rounds than this is worth a line in the log
# A newcomer this many rounds behind takes the state again. A few rounds are the
# state transfer's own latency: taking it again would lag the same.
TAKE_AGAIN_ROUNDS = 10
# Its donors hear of it within a Hello and a heartbeat (about 1.5 s): taken again
# at once, the state would be as stale, so it waits this long after the last take
# (the exchange refused at once: it would only spin). After that many times it
# steps up as any worker does: a donor that never sees it must not hold it.
TAKE_AGAIN_EVERY_S = 0.5
TAKE_AGAIN_TIMES = 5


@dataclass(frozen=True)
class StepUp:
    round: int  # the round to continue from: the next one is the partner's
    logged: bool  # a step over more than STEP_UP_LOG_ROUNDS rounds


def step_up(own: int, ahead: int) -> StepUp | None:
    """`own`: this worker's round; `ahead`: the round a partner said it is in
    (below `own` when none did). None: no partner is ahead."""
    if ahead <= own:
        return None
    return StepUp(ahead - 1, ahead - own > STEP_UP_LOG_ROUNDS)


def take_again(own: int, ahead: int, exchanged: bool, times: int, since_s: float) -> float | None:
    """Whether a worker in round `own`, with a partner in round `ahead`, takes
    the state again rather than step up: it has not `exchanged` with anyone since
    it came in, is more than TAKE_AGAIN_ROUNDS behind, and took it fewer than
    TAKE_AGAIN_TIMES `times`. Then the seconds to wait first: until
    TAKE_AGAIN_EVERY_S after it last took it, `since_s` ago. None: step up."""
    if exchanged or ahead - own <= TAKE_AGAIN_ROUNDS or times >= TAKE_AGAIN_TIMES:
        return None
    return max(0.0, TAKE_AGAIN_EVERY_S - since_s)
