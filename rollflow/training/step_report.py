"""What the trainer reports: the metrics of each step and the summary of a run.

What it is: ``data_metrics`` (how fresh the step's groups were, what was dropped or quarantined around
them, how long the data wait took), ``step_metrics`` (the step's numbers for the ``MetricsSink``: the
actor's stats, rewards, advantages, tokens and the time split of the step) and ``TrainSummary`` (what
one ``Trainer.run`` did, with a one-line ``brief``).

What it is not: the counters' bookkeeping or the decision of what to log when (``trainer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rollflow.training.batching import TrainBatch
from rollflow.training.source import Collected


def data_metrics(got: Collected, version: int) -> dict[str, float]:
    """Staleness (``version - head_version``) of the groups in hand, drops, quarantines, the wait."""
    heads = [g.head_version for g in got.groups if g.head_version >= 0]
    lags = [version - h for h in heads] or [0]
    info = {
        "staleness_mean": float(np.mean(lags)),
        "staleness_max": float(max(lags)),
        "dropped_stale": float(got.dropped_stale),
        "quarantined": float(got.quarantined),
        "data_wait_s": got.wait_s,
    }
    if got.commit_latency_s:
        info["commit_to_consume_s"] = float(np.mean(got.commit_latency_s))
    return info


def step_metrics(
    stats: dict[str, float],
    info: dict[str, float],
    batch: TrainBatch,
    *,
    version: int,
    n_signal: int,
    times: dict[str, float],
) -> dict[str, float]:
    """One step's metrics: ``stats`` from the actor, ``info`` from ``data_metrics``, then the batch's
    numbers; ``times`` holds ``take_time_s``, ``compute_time_s``, ``checkpoint_time_s``, ``step_time_s``."""
    assert batch.advantages is not None
    return {
        **stats,
        **info,
        "version": float(version),
        "reward_mean": float(batch.rewards.mean().item()),
        "reward_std": float(batch.rewards.std().item()) if batch.n_seqs > 1 else 0.0,
        "adv_abs_mean": float(batch.advantages.abs().mean().item()),
        "groups": float(len(batch.groups)),
        "signal_group_frac": n_signal / max(1, len(batch.groups)),
        "seqs": float(batch.n_seqs),
        "tokens": float(batch.n_tokens),
        "train_tokens_per_s": batch.n_tokens / max(times["compute_time_s"], 1e-9),
        **times,
    }


@dataclass
class TrainSummary:
    final_version: int
    steps_run: int  # steps run by this process (after any resume)
    groups_consumed: int  # over the whole run, resumed counters included
    dropped_stale: int
    resumed_from: int | None  # version of the resume point loaded, None on a fresh start
    stopped: bool = False  # stop_event ended the run before train.steps
    done: bool = False  # the done marker was written
    published_versions: list[int] = field(default_factory=list, repr=False)  # one per version: see brief()
    quarantined: int = 0
    wall_time_s: float = 0.0

    def brief(self) -> str:
        """One line for a log: counts and ranges, never the list of every published version."""
        pub = self.published_versions
        published = (
            f"{len(pub)} checkpoint(s) published (v{min(pub)}..v{max(pub)})" if pub else "none published"
        )
        start = "fresh start" if self.resumed_from is None else f"resumed at v{self.resumed_from}"
        return (
            f"version {self.final_version} after {self.steps_run} step(s) ({start}), "
            f"{self.groups_consumed} groups trained, {self.dropped_stale} dropped as stale, "
            f"{self.quarantined} quarantined; {published}; {self.wall_time_s:.1f} s"
        )
