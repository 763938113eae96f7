"""What a run of a trial reports: its summary, the report of a finished trial, and the summary's table.

What it is:
- ``run_summary``: the flow's summary of a trial it trained (final version, accuracy before and after,
  the loops' counters, where it is stored, its MLflow run, wall time, what bounded the time);
- ``finished_report``: what a resume of a finished trial reports (it trains, logs and registers nothing);
- ``summary_markdown``: the summary as the markdown table of the ``async-rl-summary`` artifact.
What it is not: the console lines (``rollflow``'s command prints them) or Prefect (the flow publishes the
artifact).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rollflow.api.config import ExperimentConfig

if TYPE_CHECKING:
    from rollflow.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)


def _scalars(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not isinstance(v, (list, dict))}


def run_summary(
    cfg: ExperimentConfig,
    parts: dict[str, Any],
    *,
    storage_uri: str,
    tracker: MlflowTracker | None,
    source_version: str | None,
    wall_s: float,
) -> dict[str, Any]:
    """The summary of a trained trial; ``parts``: the run's ``before``/``after``/``train``/``rollout``/``timing``."""
    return {
        "experiment": cfg.experiment,
        "trial": cfg.trial,
        "final_version": int(parts["train"]["final_version"]),
        "eval_accuracy_before": parts["before"]["accuracy"],
        "eval_accuracy_after": parts["after"]["accuracy"],
        "train": _scalars(parts["train"]),
        "rollout": _scalars(parts["rollout"]),
        "storage_uri": storage_uri,
        "mlflow_run_id": tracker.run_id if tracker else None,
        "mlflow_run_url": tracker.run_url if tracker else "-",
        "mlflow_tracking_uri": tracker.tracking_uri if tracker else None,
        "source_model_version": source_version,
        "wall_s": wall_s,
        "time_bounds": parts.get("timing", {}).get("bounds"),
    }


def finished_report(cfg: ExperimentConfig, done: dict[str, Any]) -> dict[str, Any]:
    """A resume of a finished trial: report what is recorded; train, log and register nothing."""
    run = None
    if cfg.tracking.enabled:
        from rollflow.tracking.mlflow_tracker import MlflowTracker

        run = MlflowTracker(cfg).find_run()
    final = int(done.get("version", 0))  # the trainer's DONE.json
    log.info("trial %s already finished at version %d; nothing to do", cfg.trial, final)
    return {
        "experiment": cfg.experiment,
        "trial": cfg.trial,
        "already_finished": True,
        "final_version": final,
        "mlflow_run_id": run.info.run_id if run else None,
        "registered_model": (run.data.tags.get("rollflow.registry.version") if run else None),
    }


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# async-rl: {summary['experiment']} / {summary['trial']}",
        "",
        "| | |",
        "| --- | --- |",
        f"| final policy version | {summary['final_version']} |",
        f"| eval accuracy before | {summary['eval_accuracy_before']:.3f} |",
        f"| eval accuracy after | {summary['eval_accuracy_after']:.3f} |",
        f"| groups trained on | {summary['train'].get('groups_consumed', '?')} |",
        f"| stale groups dropped | {summary['train'].get('dropped_stale', '?')} |",
        f"| wall time | {summary['wall_s']:.0f} s |",
        f"| storage | `{summary['storage_uri']}` |",
        f"| MLflow run | [{summary['mlflow_run_id']}]({summary['mlflow_run_url']}) |",
        f"| registered model | {summary.get('registered_model') or '-'} ({summary.get('registry_decision')}) |",
        f"| started from | {summary.get('source_model_version') or 'base model'} |",
    ]
    return "\n".join(lines)
