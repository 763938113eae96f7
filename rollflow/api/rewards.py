"""The reward contracts: the function a user writes (``RewardFn``) and what a workflow scores with
(``RewardScorer``).

What it is. A reward function is a plain, synchronous, module-level function

    reward_fn(prompt: str, completion: str, answer: str, **data) -> float

``prompt`` is the last user message, ``completion`` the decoded model output (special tokens skipped),
``answer`` the dataset row's reference and ``data`` the row's other passthrough fields (JSON values). It
is named in config by its import string ``"pkg.module:name"``, because reward worker processes import it
by that name (no pickled callables). A reward must be a finite number with ``|reward| <= 1e6``
(``rollflow.rewards.protocol.check_reward``); one that raises, hangs or returns anything else scores 0
and is counted.

A ``RewardScorer`` runs reward functions for a workflow; each call returns a ``ScoredOutcome``. The shipped
runners (``rollflow.rewards.AsyncRewardRunner`` in worker processes, ``rollflow.rewards.inprocess`` on
threads) are ``RewardRunner``s: they also score a prompt's completions in one call and own workers that
``close`` stops. A scorer of your own needs only ``ascore``.

What it is not: the runners or any particular reward (``rollflow.rewards``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


class RewardFn(Protocol):
    """``fn(prompt, completion, answer, **data) -> float``."""

    def __call__(self, prompt: str, completion: str, answer: str, **data: Any) -> float: ...


class ScoredOutcome(Protocol):
    """One scored completion (``rollflow.rewards.RewardOutcome``). ``score`` counts only when ``error`` is
    None and ``timed_out`` is False. ``infra_error``: no worker could score it, which says nothing about
    the completion (the group is dropped, not trained on).
    """

    @property
    def score(self) -> float: ...

    @property
    def error(self) -> str | None: ...

    @property
    def timed_out(self) -> bool: ...

    @property
    def infra_error(self) -> bool: ...


class RewardScorer(Protocol):
    """Scores completions with the reward function; never raises for the function's own failures."""

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> ScoredOutcome: ...


@runtime_checkable
class RewardRunner(RewardScorer, Protocol):
    """A scorer with workers of its own (the shipped runners): a prompt's completions in one call, and
    ``close`` to stop the workers (the workflow that built the runner closes it)."""

    async def ascore_many(
        self, prompt: str, completions: Sequence[str], answer: Any, **data: Any
    ) -> Sequence[ScoredOutcome]: ...

    def close(self) -> None: ...
