"""How a finished episode is judged: failed, rejected (and why), or accepted.

What it is: the decisions the executor's scheduler takes on each finished episode, as plain functions:

- ``finished_group(task)``: the episode's result, type-checked and validated; raising means the episode
  failed (``arun_episode`` raised, or returned something that is not a valid ``TrajectoryGroup | None``);
- ``reject_reason(group, ...)``: ``none`` (the workflow returned None), ``empty``, ``filtered``
  (``should_accept_fn(group)`` is False) or ``stale`` (``StalenessManager.is_stale``: the oldest-first
  trainer would drop it anyway); None means accept;
- ``record_failure`` and ``check_failure_rate``: count a raised episode (the first traceback is kept and
  logged), and raise ``RolloutFailureError`` once more than ``max_failure_rate`` of at least
  ``min_episodes`` episodes that ran raised.

What it is not: scheduling or the writer (``rollflow.rollout.executor``), the counters
(``executor_stats``), or the staleness arithmetic (``rollflow.api.staleness``).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable, Hashable
from typing import Literal

from rollflow.api.errors import RolloutFailureError
from rollflow.rollout.executor_stats import ExecutorStats
from rollflow.rollout.staleness import StalenessManager
from storage.schema import TrajectoryGroup

logger = logging.getLogger(__name__)

RejectReason = Literal["none", "empty", "filtered", "stale", "skipped"]
ShouldAcceptFn = Callable[[TrajectoryGroup], bool]


def finished_group(task: asyncio.Task[TrajectoryGroup | None]) -> TrajectoryGroup | None:
    """The finished ``task``'s group (validated when it has rows); raises what the episode raised,
    ``TypeError`` for a result that is not a group, or the validation error of a malformed group."""
    group = task.result()
    if group is None:
        return None
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"arun_episode returned {type(group).__name__}, not TrajectoryGroup | None")
    if group.rows:
        group.validate()
    return group


def reject_reason(
    group: TrajectoryGroup | None,
    *,
    should_accept: ShouldAcceptFn | None,
    staleness: StalenessManager,
    version: int,
) -> RejectReason | None:
    """Why ``group``, finished at trainer ``version``, is rejected; None to accept it."""
    if group is None:
        return "none"
    if not group.rows:
        return "empty"
    if should_accept is not None and not should_accept(group):
        return "filtered"
    if staleness.is_stale(group.head_version, version):
        return "stale"
    return None


def record_failure(stats: ExecutorStats, key: Hashable, exc: BaseException) -> None:
    """Count episode ``key``'s failure; the first one is kept in full (and logged at ERROR)."""
    stats.failed += 1
    if stats.first_failure is None:
        stats.first_failure = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        logger.error("episode %s raised (first failure):\n%s", key, stats.first_failure)
    else:
        logger.warning("episode %s raised %s: %s", key, type(exc).__name__, exc)


def check_failure_rate(stats: ExecutorStats, *, max_failure_rate: float, min_episodes: int) -> None:
    """``RolloutFailureError`` when more than ``max_failure_rate`` of the episodes that ran raised."""
    if not stats.failed:
        return
    ran = stats.finished - stats.rejected.get("skipped", 0)  # skipped rows never ran
    rate = stats.failed / ran
    if ran >= min_episodes and rate > max_failure_rate:
        raise RolloutFailureError(
            f"{stats.failed} of {ran} rollout episodes raised ({rate:.0%} > "
            f"rollout.max_failure_rate={max_failure_rate:.0%}); first failure:\n{stats.first_failure}"
        )
