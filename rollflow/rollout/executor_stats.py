"""`ExecutorStats`: the counters of one `WorkflowExecutor` run, and their flat metrics view.

What it is: plain counters the executor's scheduler updates on its loop thread (episodes started, judged,
failed, cancelled; tokens and completions generated; busy time; reward and staleness of accepted groups;
writer flushes and errors). ``as_metrics`` turns them into numbers for a ``MetricsSink``.

What it is not: the staleness capacity (``StalenessManager`` owns that, including counts restored after a
restart) and no scheduling logic.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from storage.schema import TrajectoryGroup


@dataclass
class ExecutorStats:
    """Counters of one executor run (``StalenessManager.stat`` also holds restored counts)."""

    started: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: collections.Counter())
    failed: int = 0
    cancelled: int = 0
    tokens: int = 0  # generated (loss_mask == 1) tokens of every finished group, accepted or not
    completions: int = 0  # sequences of every finished group, accepted or not (the generation cost)
    busy_s: float = 0.0  # wall time with at least one episode running (closed spans)
    busy_since: float | None = None  # start of the open span, None while idle
    reward_sum: float = 0.0  # over rows of accepted groups
    rows: int = 0  # rows of accepted groups
    staleness_sum: int = 0  # sum over accepted groups of (version at acceptance - head_version)
    staleness_max: int = 0
    flushes: int = 0
    flush_causes: dict[str, int] = field(default_factory=lambda: collections.Counter())  # ordered_writer
    write_errors: int = 0
    first_failure: str | None = None
    started_at: float = field(default_factory=time.monotonic)

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def finished(self) -> int:
        return self.accepted + self.n_rejected + self.failed

    def record_generated(self, group: TrajectoryGroup) -> None:
        """A finished episode's group, accepted or not: what its generation cost."""
        self.tokens += sum(sum(r.loss_mask) for r in group.rows)
        self.completions += len(group.rows)

    def record_accepted(self, group: TrajectoryGroup, version: int) -> None:
        """An accepted group at trainer ``version``: its reward and its lag behind ``version``."""
        self.accepted += 1
        self.rows += len(group.rows)
        self.reward_sum += sum(r.reward for r in group.rows)
        lag = max(0, version - group.head_version) if group.head_version >= 0 else 0
        self.staleness_sum += lag
        self.staleness_max = max(self.staleness_max, lag)

    def as_metrics(self) -> dict[str, float]:
        """Flat numbers for a MetricsSink (the caller adds a prefix such as ``rollout/``)."""
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        out = {
            "episodes_started": float(self.started),
            "groups_accepted": float(self.accepted),
            "groups_rejected": float(self.n_rejected),
            "episodes_failed": float(self.failed),
            "tokens_per_s": self.tokens / elapsed,
            "completions_generated": float(self.completions),
            "completions_per_s": self.completions / elapsed,
            "busy_s": self.busy_s
            + (time.monotonic() - self.busy_since if self.busy_since is not None else 0.0),
            "reward_mean": self.reward_sum / self.rows if self.rows else 0.0,
            "staleness_mean": self.staleness_sum / self.accepted if self.accepted else 0.0,
            "staleness_max": float(self.staleness_max),
            "shard_flushes": float(self.flushes),
            "write_errors": float(self.write_errors),
        }
        out |= {f"shard_flushes_{cause}": float(n) for cause, n in self.flush_causes.items()}
        return out | {f"rejected_{reason}": float(n) for reason, n in self.rejected.items()}
