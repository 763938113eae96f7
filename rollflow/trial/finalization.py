"""Finalizing a trial: the step after training that makes it whole, and resuming it when it is missing.

What it is: a trial is done when three things are recorded, in this order, and then the record
``FINALIZED.json`` (``storage.finalization``, ``record_finalized``) is written last:

1. the final evaluation: ``eval/accuracy`` at step = the final version (the flow scores the final policy);
2. the registry decision: the tags ``rollflow.registry.decision`` / ``reason`` / ``detail`` (and the
   registered model when the gate lets it), with the run's artifacts (``FinalSteps.finish_tracking``);
3. the end of the MLflow run: FINISHED.

``finalize_trained`` is what a resume does with a trial whose trainer finished (``trainer/DONE.json``)
but whose record is missing, i.e. a run stopped between "training done" and the end of finalization.
It reuses the trial's MLflow run and runs only the steps that are not there yet:

- an ``eval/accuracy`` point at the final version exists: it is the final evaluation (the periodic
  evaluation never scores the final version), so no server is started; else ``score_final`` starts the
  servers, loads the final version and scores it;
- a registry decision tag exists: it stands (nothing is registered twice); else the gate decides, or
  finishes registering what it had decided (``rollflow.registry.stage = registering``: the gate keeps
  that decision and registers only what is missing);
- the run ends FINISHED and the record is written.

A run that already ended FINISHED with a decision (finalized before records existed) only gets its
record. A second resume then finds the record and does nothing (``rollflow.trial.choice``).

What it is not: Prefect: the steps that start servers, publish artifacts or tell a cancel from a failure
are handed in (``FinalSteps``: ``tasks/finalize.py`` builds them); nor the registry gate
(``rollflow.tracking.registry_gate``), nor the evaluation.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink
from rollflow.tracking.registry_gate import DECISION_TAG
from rollflow.trial.store import open_trial_storage
from storage.finalization import mark_finalized

if TYPE_CHECKING:
    from rollflow.tracking.mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)
FINALIZED_FIELDS = (
    "final_version",
    "eval_accuracy_after",
    "mlflow_run_id",
    "registered_model",
    "registry_decision",
)


@dataclass(frozen=True)
class FinalSteps:
    """What finalization needs from the orchestrator, handed in (the module docstring)."""

    score_final: Callable[[int, MetricsSink | None], dict[str, Any]]  # version -> {"accuracy", "rows"}
    finish_tracking: Callable[[MlflowTracker, dict[str, Any], dict[str, Any]], dict[str, Any]]
    is_interruption: Callable[[BaseException], bool]  # a cancel or Ctrl-C (MLflow KILLED), not a failure
    say: Callable[..., None] = log.info  # where the steps' lines go (%-style, as a logger's info)


def record_finalized(cfg: ExperimentConfig, summary: dict[str, Any]) -> None:
    """Write ``FINALIZED.json`` (after the MLflow run ended): the trial is whole."""
    mark_finalized(open_trial_storage(cfg), {k: summary.get(k) for k in FINALIZED_FIELDS})


def _eval_at(tracker: MlflowTracker, version: int) -> float | None:
    """The last ``eval/accuracy`` logged at step ``version`` in the trial's run, or None."""
    points = tracker.client.get_metric_history(tracker.run_id, "eval/accuracy")
    at = sorted((m.timestamp, m.value) for m in points if m.step == version)
    return float(at[-1][1]) if at else None


def _decided(tags: dict[str, str]) -> dict[str, Any]:
    return {
        "registry_decision": tags.get("rollflow.registry.reason", tags[DECISION_TAG]),
        "registered_model": tags.get("rollflow.registry.version"),
    }


def _first_summary(cfg: ExperimentConfig, final: int, done: dict[str, Any]) -> dict[str, Any]:
    return {
        "experiment": cfg.experiment,
        "trial": cfg.trial,
        "final_version": final,
        "finalized_on_resume": True,
        "train": {k: v for k, v in done.items() if not isinstance(v, (list, dict))},
        "rollout": {},
        "storage_uri": open_trial_storage(cfg).root_uri,
        "mlflow_run_id": None,
        "mlflow_run_url": "-",
        "source_model_version": None,
        "eval_accuracy_before": math.nan,
        "registered_model": None,
        "registry_decision": None,
    }


def finalize_trained(
    cfg: ExperimentConfig, done: dict[str, Any], steps: FinalSteps, *, new_tags: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the finalization steps a trained trial is missing (module docstring); returns its summary.
    ``new_tags`` go on the trial's MLflow run (the resume's ``rollflow.resume.overrides``)."""
    t0 = time.monotonic()
    final = int(done.get("version", 0))
    summary = _first_summary(cfg, final, done)
    if not cfg.tracking.enabled:
        after = steps.score_final(final, None)
        summary.update(eval_accuracy_after=after["accuracy"], wall_s=time.monotonic() - t0)
        record_finalized(cfg, summary)
        return summary
    from rollflow.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(cfg)
    run = tracker.find_run()
    tags = dict(run.data.tags) if run is not None else {}
    if run is not None and run.info.status == "FINISHED" and DECISION_TAG in tags:
        steps.say("trial %s: its MLflow run already ended with a registry decision; recording it", cfg.trial)
        tracker.run_id = run.info.run_id
        if new_tags:
            tracker.set_tags(new_tags)
        summary.update(
            mlflow_run_id=run.info.run_id, eval_accuracy_after=_eval_at(tracker, final), **_decided(tags)
        )
        summary["wall_s"] = time.monotonic() - t0
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
        _finish_run(tracker, final, tags, summary, steps)
        summary["wall_s"] = time.monotonic() - t0
        status = "FINISHED"
    except BaseException as exc:
        status = "KILLED" if steps.is_interruption(exc) else "FAILED"
        raise
    finally:
        tracker.finish(status)
    steps.say("trial %s finalized at version %d (%s)", cfg.trial, final, summary["registry_decision"])
    record_finalized(cfg, summary)
    return summary


def _finish_run(
    tracker: MlflowTracker, final: int, tags: dict[str, str], summary: dict[str, Any], steps: FinalSteps
) -> None:
    """The final evaluation and the registry decision of a trained trial, each only if it is missing."""
    before = _eval_at(tracker, 0)
    summary["eval_accuracy_before"] = math.nan if before is None else before
    recorded = _eval_at(tracker, final)
    if recorded is not None:
        steps.say("final evaluation of v%d already recorded: accuracy %.3f", final, recorded)
        after = {"accuracy": recorded, "rows": []}
    else:
        after = steps.score_final(final, tracker.sink)
    summary.update(eval_accuracy_after=after["accuracy"])
    if DECISION_TAG in tags:  # decided before the stop: it stands, nothing is registered twice
        summary.update(_decided(tags))
        tracker.log_curves_png()
    else:
        parts = {
            "before": {"rows": []},
            "after": after,
            "train": {"steps_run": final},  # the trial trained up to its final version
        }
        summary.update(steps.finish_tracking(tracker, parts, summary))
