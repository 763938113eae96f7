"""The Prefect side of finalizing a trial: the steps that need servers, tasks or artifacts.

What it is:
- ``start_tracking``: the trial's MLflow run, started with its tags (lineage with the Prefect flow run's,
  the resume's overrides, the warm start's) and its dataset inputs;
- ``finish_tracking``: log the run's artifacts to MLflow (summary, eval tables, sample trajectories, the
  viewer page, curves, timeline) and the sample trajectories as a Prefect table, then apply the registry
  gate (``rollflow.tracking.registry_gate``) and log its outcome;
- ``finalize_trained``: a resume of a trained trial (``rollflow.trial.finalization.finalize_trained``),
  with this layer's steps handed in: scoring the final version on started servers, ``finish_tracking``,
  and telling a cancel from a failure;
- ``publish_summary``: the ``async-rl-summary`` markdown artifact (``rollflow.trial.summary``).

What it is not: the order of finalization or its record (``rollflow.trial.finalization``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink
from rollflow.tracking.mlflow_tracker import MlflowTracker
from rollflow.trial import finalization
from rollflow.trial.lineage import run_lineage_tags
from rollflow.trial.store import open_trial_storage
from rollflow.trial.summary import summary_markdown
from tasks.runtime import flow_run_lineage, is_interruption
from tasks.tracking import markdown_artifact, table_artifact

if TYPE_CHECKING:
    from rollflow.trial.opening import OpenTrial
    from tasks.runtime import RunLogger


def start_tracking(opened: OpenTrial) -> MlflowTracker | None:
    """The opened trial's MLflow run, started (module docstring); None when tracking is off."""
    cfg = opened.cfg
    if not cfg.tracking.enabled:
        return None
    from rollflow.training.warm_start_reuse import warm_start_tags
    from rollflow.trial.lineage import run_lineage

    tracker = MlflowTracker(cfg)
    lineage = run_lineage(cfg, opened.source_version, flow_run_lineage())
    tracker.start(tags={**lineage, **opened.tags, **warm_start_tags(cfg)})
    tracker.log_dataset_inputs()  # the train and eval sets as the run's MLflow dataset inputs
    return tracker


def finish_tracking(
    cfg: ExperimentConfig, tracker: MlflowTracker, parts: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """Log the run's artifacts, then register the policy if the gate says so; returns summary fields."""
    from rollflow.rollout.inspect import sample_trajectories
    from rollflow.tracking.registry_gate import apply_registry_gate
    from rollflow.viewer.trial import trajectory_report

    tracker.log_dict({k: v for k, v in summary.items()}, "summary.json")
    tracker.log_table(parts["after"]["rows"][:100], "eval/after.json")
    tracker.log_table(parts["before"]["rows"][:100], "eval/before.json")
    storage = open_trial_storage(cfg)
    samples = sample_trajectories(storage, cfg.model.path, limit=cfg.tracking.n_sample_trajectories)
    tracker.log_table(samples, "trajectories/samples.json")
    tracker.log_html(trajectory_report(cfg), "trajectories/viewer.html")  # the viewer's page, last versions
    table_artifact(samples[:20], key="sample-trajectories", description="Decoded sample trajectories")
    tracker.log_curves_png()
    if parts.get("timing", {}).get("doc"):
        tracker.log_timeline(parts["timing"]["doc"])
    outcome = apply_registry_gate(
        cfg,
        tracker,
        storage,
        final_version=summary["final_version"],
        steps_trained=int(parts["train"].get("steps_run", 0)),
        eval_accuracy_after=summary["eval_accuracy_after"],
        eval_accuracy_before=summary["eval_accuracy_before"],
        source_model_version=summary.get("source_model_version"),
        lineage_tags=lambda: run_lineage_tags(tracker),
    )
    if outcome.decision != "disabled":
        get_run_logger().info("registry: %s (%s)", outcome.decision, outcome.detail)
    return {"registered_model": outcome.registered_model, "registry_decision": outcome.registry_decision}


def _score_final(cfg: ExperimentConfig, final: int, sink: MetricsSink | None) -> dict[str, Any]:
    """Start the servers, load checkpoint ``final`` into them (the checkpoint watcher, as in a run) and
    score it on the held-out prompts; the servers are stopped afterwards."""
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore
    from tasks.bootstrap import bootstrap_model
    from tasks.evaluate import evaluate_policy
    from tasks.servers import start_servers, stop_servers

    storage = open_trial_storage(cfg)
    servers = start_servers(cfg, bootstrap_model(cfg))
    try:
        watcher = CheckpointWatcher.from_config(
            cfg.inference,
            CheckpointStore(storage, ack_ttl_s=cfg.storage.ack_ttl_s),
            servers.addresses,
            cache_dir=Path(cfg.storage.local_cache) / cfg.experiment / cfg.trial,
            ack_ttl_s=cfg.storage.ack_ttl_s,
        )
        watcher.start()
        try:
            if not watcher.wait_for_version(final, timeout_s=cfg.inference.startup_timeout_s):
                raise TimeoutError(
                    f"the servers did not load the final version {final}: {watcher.errors[-1:]}"
                )
        finally:
            watcher.stop()
        return evaluate_policy(cfg, servers.addresses, label="after", min_version=final, metrics=sink)
    finally:
        stop_servers(servers)


def finalize_trained(
    cfg: ExperimentConfig, done: dict[str, Any], logger: RunLogger, *, new_tags: dict[str, str] | None = None
) -> dict[str, Any]:
    """Finalize a trained trial (``rollflow.trial.finalization``) with this layer's steps; its summary."""
    steps = finalization.FinalSteps(
        score_final=lambda final, sink: _score_final(cfg, final, sink),
        finish_tracking=lambda tracker, parts, summary: finish_tracking(cfg, tracker, parts, summary),
        is_interruption=is_interruption,
        say=logger.info,
    )
    return finalization.finalize_trained(cfg, done, steps, new_tags=new_tags)


def publish_summary(summary: dict[str, Any]) -> None:
    markdown_artifact(summary_markdown(summary), key="async-rl-summary", description="Run summary")
