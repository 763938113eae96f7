"""Finalization records (rollflow/trial/finalization.py, storage/finalization.py), without servers.

A trial finalized before finalization records existed (its MLflow run ended FINISHED with a registry
decision, trainer/DONE.json written, no FINALIZED.json) is recorded on its next resume and reported as
finished: nothing is scored, logged or registered again. The full path (a flow SIGKILLed after
training, then resumed) is tests/flows/test_interrupt.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rollflow.configuration.loader import load_config
from rollflow.trial.choice import trial_state
from storage.checkpoints import CheckpointStore
from storage.finalization import read_finalized
from storage.fs import Storage


def test_a_trial_finalized_before_records_existed_only_gets_its_record(tmp_path: Path) -> None:
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from tasks.finalize import finalize_trained

    cfg = load_config(
        overrides=[
            "experiment=fin", "trial=old", f"storage.root={tmp_path / 'st'}",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ]
    )  # fmt: skip
    tracker = MlflowTracker(cfg, base_dir=tmp_path)
    tracker.start()
    tracker.sink.log({"eval/accuracy": 0.75}, step=3)
    tracker.set_tags({"rollflow.registry.decision": "skipped", "rollflow.registry.reason": "eval-worse"})
    tracker.finish("FINISHED")
    storage = Storage.open(cfg.storage.root, cfg.experiment, cfg.trial)
    CheckpointStore(storage).mark_done({"version": 3})
    assert trial_state(storage)[0] == "trained"
    end = tracker.client.get_run(tracker.run_id).info.end_time

    out = finalize_trained(cfg, {"version": 3}, logging.getLogger("test"))
    assert out["already_finished"] and out["eval_accuracy_after"] == 0.75
    assert read_finalized(storage)["registry_decision"] == "eval-worse"
    assert trial_state(storage)[0] == "finished"
    run = tracker.client.get_run(tracker.run_id)
    assert (run.info.status, run.info.end_time) == ("FINISHED", end)  # the run was not touched
    assert len(tracker.client.get_metric_history(tracker.run_id, "eval/accuracy")) == 1
