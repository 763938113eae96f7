"""What a rollout worker reports: its summary, its state on each tick, its metrics, a broken reward.

What it is: ``RolloutSummary`` (what one run of a worker did), ``rollout_state`` (the time-accounting
state of one tick), ``rollout_metrics`` (the numbers a worker logs every ``metrics_interval_s``) and
``check_reward_fn`` (a reward function that raised on every call is an error, not zeros to train on).

What it is not: the worker itself (``rollflow.rollout.loop``) or the metrics sink (``rollflow.api.metrics``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rollflow.api.errors import RewardFunctionError
from rollflow.rollout.executor_stats import ExecutorStats
from rollflow.rollout.staleness import StalenessManager

REWARD_BROKEN_AFTER = 64  # reward calls that all raised before the loop calls the reward function broken
StopReason = Literal["done", "stop_event", "limit", "epochs"]


@dataclass
class RolloutSummary:
    """What one run of the loop did (``total_accepted``: committed by every run of this worker name)."""

    stopped_by: StopReason
    accepted: int
    rejected: int
    failed: int
    total_accepted: int
    epoch: int
    position: int
    tokens: int
    tokens_per_s: float
    elapsed_s: float
    shards: int
    bad_rows: int
    writer: str
    skipped: int = 0  # prompts the curriculum did not generate (released; not in ``rejected``)

    def brief(self) -> str:
        """One line for a log."""
        return (
            f"{self.accepted} groups accepted ({self.rejected} rejected, {self.failed} failed"
            + (f", {self.skipped} prompts skipped by the curriculum" if self.skipped else "")
            + "), "
            f"{self.tokens} tokens at {self.tokens_per_s:.0f} tok/s in {self.elapsed_s:.1f} s, "
            f"{self.shards} shards; stopped by {self.stopped_by}"
        )


def rollout_state(
    n_running: int,
    staleness_room: int,
    *,
    loading: bool,
    buffered: bool = False,
    claim_blocked: bool = False,
    exhausted: bool = False,
) -> str:
    """The rollout's state on one tick (``rollflow.clock.roles``; a sample every ``poll_interval_s``, so
    its shares are estimates at that resolution), first match wins:

    - ``paused``: a weight load has the servers paused;
    - ``generating``: episodes in flight (their reward scoring included);
    - ``flush_wait``: nothing runs and accepted groups wait in the shard writer's buffer (being committed);
    - ``capacity_wait``: nothing runs because the staleness bound holds new episodes back: waiting for the
      trainer's next version;
    - ``claim_wait``: the bound has room but the claim gate (``staleness.claim_fits``, every worker's claims
      together) refused the next block of prompts;
    - ``exhausted``: every prompt of every allowed epoch was handed out;
    - ``idle``: none of those (start-up, or the tick between an episode's end and the next start)."""
    if loading:
        return "paused"
    if n_running > 0:
        return "generating"
    if buffered:
        return "flush_wait"
    if staleness_room <= 0:
        return "capacity_wait"
    if claim_blocked:
        return "claim_wait"
    return "exhausted" if exhausted else "idle"


def rollout_metrics(
    stats: ExecutorStats, staleness: StalenessManager, workflow_metrics: Mapping[str, float], version: int
) -> dict[str, float]:
    """The executor's counters, the staleness counters at ``version`` and the workflow's ``metrics()``."""
    out = stats.as_metrics()
    s = staleness.stat
    out.update(
        {
            "running": float(s.running),
            "groups_total": float(s.accepted),
            "capacity": float(max(0, staleness.get_capacity(version))),
            "version": float(version),
        }
    )
    out.update(workflow_metrics)
    return out


def check_reward_fn(workflow_metrics: Mapping[str, float], *, after: int = REWARD_BROKEN_AFTER) -> None:
    """``RewardFunctionError`` once the reward function raised on every one of at least ``after`` calls
    (the workflow's ``reward_scored`` / ``reward_errors`` metrics): it is broken, and training on its
    zeros (or resuming the run) would not help."""
    scored = int(workflow_metrics.get("reward_scored", 0))
    errors = int(workflow_metrics.get("reward_errors", 0))
    if scored < after or errors < scored:
        return
    raise RewardFunctionError(
        f"the reward function raised on all {errors} of its calls so far; the "
        "rollout log quotes its errors (trajectory rows also carry them as extra.reward_error). Fix "
        "dataset.reward_fn and run again"
    )
