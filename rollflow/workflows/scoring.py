"""The scoring block of a workflow: completions in, ``(score, info)`` out, counted.

What it is. ``RewardScoring`` holds a workflow's ``RewardScorer`` (by default an ``AsyncRewardRunner``
over ``reward_fn`` with its own worker processes, or threads for a reward registered in-process:
``rollflow.rewards.inprocess``) and its ``RewardCounts``. ``ascore_many`` scores a prompt's completions
in one reward-worker round trip when the scorer can take a batch. A reward that raises or times out
scores 0, is counted, and says so in the row's ``extra`` (``reward_error``, ``reward_timed_out``); a
completion no worker could score (``infra_error``) raises ``RewardInfrastructureError``: reward
infrastructure is not a training signal, so the workflow drops the group (``drop_group``).

``judge_outcome`` and ``raise_if_unscored`` are the same rules for a workflow that calls a scorer
itself (``AgentWorkflow`` passes the transcript).

What it is not: the runners (``rollflow.rewards``) or the reward functions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.rewards import RewardFn, RewardRunner, RewardScorer, ScoredOutcome

logger = logging.getLogger(__name__)

ROW_FIELDS = ("messages", "answer", "prompt_id")  # a dataset row's fields that are not passthrough data


@dataclass
class RewardCounts:
    """What the workflow saw of the reward function (the runner keeps its own stats too)."""

    scored: int = 0
    errors: int = 0
    timeouts: int = 0
    dropped_samples: int = 0  # samples that returned None (aborted)
    dropped_groups_infra: int = 0  # groups dropped because a reward worker could not score a sample
    score_sum: float = 0.0

    def record(self, score: float, info: dict[str, Any]) -> None:
        """Count one judged outcome (``judge_outcome``)."""
        self.scored += 1
        self.timeouts += "reward_timed_out" in info
        self.errors += "reward_error" in info
        self.score_sum += score

    def as_metrics(self) -> dict[str, float]:
        return {
            "reward_scored": float(self.scored),
            "reward_errors": float(self.errors),
            "reward_timeouts": float(self.timeouts),
            "samples_dropped": float(self.dropped_samples),
            "groups_dropped_reward_infra": float(self.dropped_groups_infra),
        }


def judge_outcome(outcome: ScoredOutcome) -> tuple[float, dict[str, Any]]:
    """``(score, info)``: a timed-out or failed call scores 0 and says why in ``info`` (the row's extra)."""
    info: dict[str, Any] = {}
    if outcome.timed_out:
        info["reward_timed_out"] = True
    if outcome.error:
        info["reward_error"] = str(outcome.error)[:500]
    return (float(outcome.score) if not info else 0.0), info


def raise_if_unscored(outcomes: Sequence[ScoredOutcome], prompt_id: Any) -> None:
    """Raise ``RewardInfrastructureError`` when no worker could score one of ``outcomes``."""
    lost = [o for o in outcomes if o.infra_error]
    if lost:
        raise RewardInfrastructureError(f"reward of prompt {prompt_id!r}: {lost[0].error}")


def passthrough(data: dict[str, Any]) -> dict[str, Any]:
    """The dataset row's fields a reward function gets as ``**data``."""
    return {k: v for k, v in data.items() if k not in ROW_FIELDS}


def open_scorer(
    reward_fn: str | RewardFn | Callable[..., float] | None,
    reward_runner: RewardScorer | None,
    *,
    workers: int,
    timeout_s: float,
) -> tuple[RewardScorer | None, bool]:
    """``(scorer, owned)``: ``reward_runner`` as given (not owned), else a runner over ``reward_fn``
    (owned: the workflow closes it), else ``(None, False)`` when there is no reward function."""
    if reward_runner is not None or reward_fn is None:
        return reward_runner, False
    from rollflow.rewards.inprocess import reward_runner_for

    return reward_runner_for(reward_fn, max_workers=workers, timeout_s=timeout_s), True


def close_scorer(scorer: RewardScorer | None) -> None:
    """Stop a scorer's workers (only a ``RewardRunner`` has any)."""
    if isinstance(scorer, RewardRunner):
        scorer.close()


class RewardScoring:
    """A workflow's reward side: its scorer, what it saw, and whether it owns the scorer's workers."""

    def __init__(
        self,
        reward_fn: str | RewardFn | Callable[..., float],
        reward_runner: RewardScorer | None = None,
        *,
        workers: int = 2,
        timeout_s: float = 10.0,
    ) -> None:
        runner, self.owns_runner = open_scorer(reward_fn, reward_runner, workers=workers, timeout_s=timeout_s)
        assert runner is not None  # reward_fn is required here
        self.runner: RewardScorer = runner
        self.counts = RewardCounts()

    async def ascore(
        self, messages: list[dict[str, str]], completion: str, data: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """``ascore_many`` of one completion.

        Raises:
            RewardInfrastructureError: no worker could score it.
        """
        return (await self.ascore_many(messages, [completion], data))[0]

    async def ascore_many(
        self, messages: list[dict[str, str]], completions: Sequence[str], data: dict[str, Any]
    ) -> list[tuple[float, dict[str, Any]]]:
        """``(score, info)`` per completion of the prompt ``messages`` (its last user message is the
        reward's ``prompt``): one round trip when the scorer can take a batch, else one call each.

        Raises:
            RewardInfrastructureError: no worker could score one of them (nothing is counted then).
        """
        if not completions:
            return []
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        extra, answer = passthrough(data), data.get("answer")
        if isinstance(self.runner, RewardRunner):
            outcomes = await self.runner.ascore_many(prompt, list(completions), answer, **extra)
        else:
            outcomes = await asyncio.gather(
                *(self.runner.ascore(prompt, c, answer, **extra) for c in completions)
            )
        raise_if_unscored(outcomes, data.get("prompt_id"))
        judged = [judge_outcome(outcome) for outcome in outcomes]
        for score, info in judged:
            self.counts.record(score, info)
        return judged

    def drop_group(self, prompt_id: str, exc: RewardInfrastructureError) -> None:
        """Count and log a group dropped because no reward worker could score one of its samples."""
        self.counts.dropped_groups_infra += 1
        logger.error(
            "group of prompt %s dropped: a reward worker could not score a sample (%s)", prompt_id, exc
        )

    def close(self) -> None:
        """Stop the reward workers this scoring started (a given ``reward_runner`` is its owner's)."""
        if self.owns_runner:
            close_scorer(self.runner)
