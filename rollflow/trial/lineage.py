"""Lineage tags for an MLflow run and its registered model version: where the run came from.

What it is: ``run_lineage(cfg, source_version, flow_tags)`` returns the tags a run starts with: the
orchestrator's (``flow_tags``: the Prefect flow run's id, UI link and deployment), the git commit of the project, the data window the run drew from,
and, for a retrain, the registered version it started from. ``run_lineage_tags(tracker)`` reads them
back from the run, to copy onto the model version it registers.
What it is not: tracking itself (rollflow/tracking), Prefect (the flow passes its run's tags) or anything
that changes the run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from rollflow.api.config import ExperimentConfig

GIT_COMMIT_TAG = "mlflow.source.git.commit"
LINEAGE_PREFIXES = ("prefect.", "rollflow.source_", "rollflow.data_window", GIT_COMMIT_TAG)

if TYPE_CHECKING:
    from rollflow.tracking.mlflow_tracker import MlflowTracker


def git_commit(project_dir: str | Path = ".") -> str | None:
    """The project's HEAD commit, else ``$ROLLFLOW_GIT_COMMIT`` (set it in images without .git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_dir, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    return os.environ.get("ROLLFLOW_GIT_COMMIT") or None


def data_window(cfg: ExperimentConfig) -> str:
    """One line naming the prompts a run trains on and is scored on."""
    d = cfg.dataset
    if d.kind == "synthetic":
        s = d.synthetic
        return f"synthetic:{s.task} seed={s.seed} n_train={s.n_train} n_eval={s.n_eval}"
    limit = "all" if d.max_rows is None else str(d.max_rows)
    return f"{d.kind}:{d.path} train={d.train_split} eval={d.eval_split} max_rows={limit}"


def run_lineage(
    cfg: ExperimentConfig, source_version: str | None, flow_tags: dict[str, str]
) -> dict[str, str]:
    tags = {"rollflow.mode": cfg.orchestration.mode, "rollflow.data_window": data_window(cfg)}
    tags.update(flow_tags)
    commit = git_commit()
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    if source_version is not None:
        tags["rollflow.source_model_version"] = source_version
        tags["rollflow.source_model"] = cfg.tracking.registered_model_name or f"{cfg.experiment}-policy"
    return tags


def run_lineage_tags(tracker: MlflowTracker) -> dict[str, str]:
    """The lineage tags recorded on the tracker's run."""
    tags = tracker.client.get_run(tracker.run_id).data.tags
    return {k: v for k, v in tags.items() if k.startswith(LINEAGE_PREFIXES)}
