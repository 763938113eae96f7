"""Built-in group filters for dynamic sampling (``should_accept_fn`` implementations).

What it is: ``reward_variance_filter(group) -> bool``, DAPO's dynamic sampling: a GRPO group whose
rewards are all equal has every advantage exactly 0,

    A_i = (r_i - mean_g) / (std_g + eps) = 0     for every i when r_1 = ... = r_n,

so it carries no policy-gradient signal and only dilutes the batch (and, under token-mean
aggregation, shrinks every other group's gradient by inflating the denominator). Dropping such groups at
acceptance time keeps every training batch full of groups that teach something; the rollout pays for
it with more generation per step, which the executor counts (``rollout/rejected_filtered``,
``rollout/completions_generated``) so the cost is visible next to the gain.

Turn it on with ``rollout.dynamic_sampling: true`` (or name it yourself:
``rollout.should_accept_fn: rollflow.rollout.filters:reward_variance_filter``).

The cap (``rollout.dynamic_sampling_max_extra`` = c, ``CappedVarianceFilter``): with a fraction p of the
groups carrying signal, uncapped dynamic sampling generates 1/p groups per group kept (14x at p = 0.07);
the cap keeps the dropped groups at most c per kept group,

    dropped <= c * kept,

so generation per kept group is at most 1 + c, and past the cap a group without signal is kept (it
costs the trainer nothing: zero-advantage groups skip the passes, rollflow/training/microbatch.py).

``group_outcome(rewards, solved_reward)`` names how a group came out (``signal``, ``solved`` or
``unsolved``), the one classification the prompt curriculum and the prompt review both use.

What it is not: a reward model or a curriculum; it never looks at the text, only at the rewards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from rollflow.api.workflow import import_string
from storage.schema import TrajectoryGroup

REWARD_VARIANCE_FILTER = "rollflow.rollout.filters:reward_variance_filter"

# Two rewards closer than this count as equal (binary and rational verifiers give exact values; a
# learned or shaped reward may jitter in the last float32 bits).
EQUAL_ATOL = 1e-6


def has_reward_variance(rewards: Sequence[float]) -> bool:
    """Whether ``rewards`` are not all equal (within ``EQUAL_ATOL``); one reward has no variance."""
    return len(rewards) >= 2 and max(rewards) - min(rewards) > EQUAL_ATOL


GroupOutcome = Literal["solved", "unsolved", "signal"]


def group_outcome(rewards: Sequence[float], solved_reward: float) -> GroupOutcome:
    """How a finished group came out: ``signal`` when its rewards differ, else ``solved`` when every
    reward is >= ``solved_reward`` (within ``EQUAL_ATOL``), else ``unsolved`` (the prompt curriculum's
    and the prompt review's classification)."""
    if has_reward_variance(rewards):
        return "signal"
    return "solved" if min(rewards) >= solved_reward - EQUAL_ATOL else "unsolved"


def reward_variance_filter(group: TrajectoryGroup) -> bool:
    """True (keep) when the group's rewards are not all equal; a group of one is never kept."""
    return has_reward_variance(group.rewards)


class CappedVarianceFilter:
    """The variance filter with a cap on the groups it drops: at most ``max_extra`` per group kept.

    Counts live in the instance (one per rollout worker), so the cap holds per worker and restarts
    with it. ``max_extra`` None = no cap (the plain filter).
    """

    def __init__(self, max_extra: float | None) -> None:
        self.max_extra = max_extra
        self.kept = 0
        self.dropped = 0

    def __call__(self, group: TrajectoryGroup) -> bool:
        if reward_variance_filter(group):
            self.kept += 1
            return True
        if self.max_extra is not None and self.dropped + 1 > self.max_extra * (self.kept + 1):
            self.kept += 1  # over the cap: this group fills its batch slot without signal
            return True
        self.dropped += 1
        return False


def build_should_accept(
    dynamic_sampling: bool,
    should_accept_fn: str | Callable[[TrajectoryGroup], bool] | None,
    max_extra: float | None = None,
) -> Callable[[TrajectoryGroup], bool] | None:
    """The executor's acceptance test from ``rollout.dynamic_sampling(_max_extra)`` and ``should_accept_fn``.

    Both set: a group must pass the (capped) variance filter first, then the user's function. Neither:
    None (keep every group).
    """
    user = import_string(should_accept_fn) if isinstance(should_accept_fn, str) else should_accept_fn
    if not dynamic_sampling:
        return user
    variance = CappedVarianceFilter(max_extra)
    if user is None:
        return variance

    def both(group: TrajectoryGroup) -> bool:
        return variance(group) and bool(user(group))

    return both
