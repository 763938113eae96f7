"""Finalizing a trial: the step after training that makes it whole, and resuming it when it is missing.

What it is: a trial is done when three things are recorded, in this order, and then the record
``FINALIZED.json`` (``storage.finalization``) is written last:

1. the final evaluation: ``eval/accuracy`` at step = the final version (the flow scores the final policy);
2. the registry decision: the tags ``rollflow.registry.decision`` / ``reason`` / ``detail`` (and the
   registered model when the gate lets it), with the run's artifacts (``finish_tracking``);
3. the end of the MLflow run: FINISHED.

``finalize_trained`` is what a resume does with a trial whose trainer finished (``trainer/DONE.json``)
but whose record is missing, i.e. a run stopped between "training done" and the end of finalization.
It reuses the trial's MLflow run and runs only the steps that are not there yet:

- an ``eval/accuracy`` point at the final version exists: it is the final evaluation (the periodic
  evaluation never scores the final version), so no server is started; else the servers start, the
  checkpoint watcher loads the final version and it is scored;
- a registry decision tag exists: it stands (nothing is registered twice); else the gate decides, or
  finishes registering what it had decided (``rollflow.registry.stage = registering``: the gate keeps
  that decision and registers only what is missing);
- the run ends FINISHED and the record is written.

A run that already ended FINISHED with a decision (finalized before records existed) only gets its
record. A second resume then finds the record and does nothing (``rollflow.trials``).

What it is not: the flow (``flows/async_rl.py`` calls this), nor the registry gate
(``rollflow.tracking.registry_gate``), nor the evaluation (``tasks.evaluate``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink
from rollflow.configuration.trial_storage import open_trial_storage
from rollflow.tracking.mlflow_tracker import MlflowTracker
from rollflow.tracking.registry_gate import DECISION_TAG
from tasks.lineage import run_lineage_tags
from tasks.tracking import markdown_artifact, table_artifact

if TYPE_CHECKING:
    from tasks.runtime import RunLogger


def record_finalized(cfg: ExperimentConfig, summary: dict[str, Any]) -> None:
    """Write ``FINALIZED.json`` (after the MLflow run ended): the trial is whole."""
    from storage.finalization import mark_finalized

    storage = open_trial_storage(cfg)
    fields = (
        "final_version",
        "eval_accuracy_after",
        "mlflow_run_id",
        "registered_model",
        "registry_decision",
    )
    mark_finalized(storage, {k: summary.get(k) for k in fields})


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


def _eval_at(tracker: MlflowTracker, version: int) -> float | None:
    """The last ``eval/accuracy`` logged at step ``version`` in the trial's run, or None."""
    points = tracker.client.get_metric_history(tracker.run_id, "eval/accuracy")
    at = sorted((m.timestamp, m.value) for m in points if m.step == version)
    return float(at[-1][1]) if at else None


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
    """Run the finalization steps a trained trial is missing (module docstring); returns its summary.
    ``new_tags`` go on the trial's MLflow run (the resume's ``rollflow.resume.overrides``)."""

    t0 = time.monotonic()
    final = int(done.get("version", 0))
    storage = open_trial_storage(cfg)
    summary: dict[str, Any] = {
        "experiment": cfg.experiment,
        "trial": cfg.trial,
        "final_version": final,
        "finalized_on_resume": True,
        "train": {k: v for k, v in done.items() if not isinstance(v, (list, dict))},
        "rollout": {},
        "storage_uri": storage.root_uri,
        "mlflow_run_id": None,
        "mlflow_run_url": "-",
        "source_model_version": None,
        "eval_accuracy_before": math.nan,
        "registered_model": None,
        "registry_decision": None,
    }
    if not cfg.tracking.enabled:
        after = _score_final(cfg, final, None)
        summary.update(eval_accuracy_after=after["accuracy"], wall_s=time.monotonic() - t0)
        record_finalized(cfg, summary)
        return summary
    from rollflow.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(cfg)
    run = tracker.find_run()
    tags = dict(run.data.tags) if run is not None else {}
    if run is not None and run.info.status == "FINISHED" and DECISION_TAG in tags:
        logger.info(
            "trial %s: its MLflow run already ended with a registry decision; recording it", cfg.trial
        )
        tracker.run_id = run.info.run_id
        if new_tags:
            tracker.set_tags(new_tags)
        summary.update(
            mlflow_run_id=run.info.run_id,
            eval_accuracy_after=_eval_at(tracker, final),
            registry_decision=tags.get("rollflow.registry.reason", tags[DECISION_TAG]),
            registered_model=tags.get("rollflow.registry.version"),
            wall_s=time.monotonic() - t0,
        )
        record_finalized(cfg, summary)
        return {**summary, "finalized_on_resume": False, "already_finished": True}
    tracker.start(tags=new_tags)  # the trial's run again (find_run): RUNNING until it is finalized
    summary.update(
        mlflow_run_id=tracker.run_id,
        mlflow_run_url=tracker.run_url,
        source_model_version=tags.get("rollflow.source_model_version"),
    )
    status = "FAILED"
    try:
        before = _eval_at(tracker, 0)
        summary["eval_accuracy_before"] = math.nan if before is None else before
        recorded = _eval_at(tracker, final)
        if recorded is not None:
            logger.info("final evaluation of v%d already recorded: accuracy %.3f", final, recorded)
            after = {"accuracy": recorded, "rows": []}
        else:
            after = _score_final(cfg, final, tracker.sink)
        summary.update(eval_accuracy_after=after["accuracy"])
        if DECISION_TAG in tags:  # decided before the stop: it stands, nothing is registered twice
            summary.update(
                registry_decision=tags.get("rollflow.registry.reason", tags[DECISION_TAG]),
                registered_model=tags.get("rollflow.registry.version"),
            )
            tracker.log_curves_png()
        else:
            parts = {
                "before": {"rows": []},
                "after": after,
                "train": {"steps_run": final},  # the trial trained up to its final version
            }
            summary.update(finish_tracking(cfg, tracker, parts, summary))
        summary["wall_s"] = time.monotonic() - t0
        status = "FINISHED"
    except BaseException as exc:
        from tasks.runtime import is_interruption

        status = "KILLED" if is_interruption(exc) else "FAILED"
        raise
    finally:
        tracker.finish(status)
    logger.info("trial %s finalized at version %d (%s)", cfg.trial, final, summary["registry_decision"])
    record_finalized(cfg, summary)
    return summary


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


def publish_summary(summary: dict[str, Any]) -> None:
    markdown_artifact(summary_markdown(summary), key="async-rl-summary", description="Run summary")
