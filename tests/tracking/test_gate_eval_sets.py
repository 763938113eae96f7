"""The registry gate against a real MLflow store (SQLite) and real committed checkpoints: it compares only
runs scored on the same evaluation set, and partial-credit rewards by their mean.

Three trials of one experiment each commit a tiny random Llama as version 3 and record their final
evaluation (``eval/v000003.json``) as the flow's evaluation does; the gate then runs as the flow's
finalize runs it:

1. set A, accuracy 0.20: the first version (v1, alias ``latest-rl``);
2. set B (the user's own rows), accuracy 0.89: not comparable; registered as v2 but the alias stays on v1;
3. set A, partial credit: accuracy 0 and mean reward 0.10 against the incumbent's 0.20: worse, skipped
   (before, accuracy 0 against 0.20 was judged; with the incumbent also at 0 it would have tied and
   registered). The better-by-mean case is ``test_eval_records.py``'s (each registration here costs
   seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollflow.configuration.loader import load_config

SET_A = "sha256:" + "a" * 64
SET_B = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollflow.models.random_llama import save_random_llama
    from rollflow.models.tokenizer import build_tokenizer

    path = tmp_path_factory.mktemp("gate") / "base"
    save_random_llama(path, tokenizer=build_tokenizer())
    return path


def _gate(tmp: Path, base: Path, trial: str, record: dict[str, Any]) -> Any:  # noqa: ANN401
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from rollflow.tracking.registry_gate import apply_registry_gate
    from rollflow.trial.evaluations import write_eval_record
    from rollflow.trial.store import open_trial_storage
    from storage.checkpoints import CheckpointStore

    cfg = load_config(
        overrides=[
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
            "experiment=gatesets",
            f"trial={trial}",
            f"model.path={base}",
            f"storage.root={tmp / 'store'}",
            f"storage.local_cache={tmp / 'cache'}",
        ]
    )
    storage = open_trial_storage(cfg)
    CheckpointStore(storage).publish(base, 3)
    write_eval_record(storage, {"version": 3, "n": 100, "label": "after", **record})
    tracker = MlflowTracker(cfg)
    tracker.start()
    try:
        return apply_registry_gate(
            cfg,
            tracker,
            storage,
            final_version=3,
            steps_trained=3,
            eval_accuracy_after=record["accuracy"],
            eval_accuracy_before=0.0,
            source_model_version=None,
            lineage_tags=dict,
        ), tracker
    finally:
        tracker.finish()


def test_the_gate_compares_only_the_same_set_and_partial_credit_by_mean(base: Path, tmp_path: Path) -> None:
    first, tracker = _gate(
        tmp_path, base, "t1", {"accuracy": 0.2, "mean_reward": 0.2, "binary": True, "eval_set": SET_A}
    )
    assert (first.decision, first.registry_decision) == ("registered", "first-version")
    client = tracker.client
    alias = lambda: client.get_model_version_by_alias("gatesets-policy", "latest-rl")  # noqa: E731
    assert str(alias().version) == "1" and alias().tags["eval_set_digest"] == SET_A
    assert alias().tags["eval_binary"] == "true" and alias().tags["eval_mean_reward"] == "0.2000"

    other, _ = _gate(
        tmp_path, base, "t2", {"accuracy": 0.89, "mean_reward": 0.89, "binary": True, "eval_set": SET_B}
    )
    assert (other.decision, other.registry_decision) == ("registered", "not-comparable")
    assert other.tags["rollflow.registry.alias_moved"] == "false"
    assert other.tags["rollflow.registry.comparable"] == "false"
    assert other.tags["rollflow.registry.incumbent_eval_set"] == SET_A
    assert other.registered_model == "gatesets-policy v2"
    assert str(alias().version) == "1"  # the champion did not move
    assert client.get_model_version("gatesets-policy", "2").tags["comparable"] == "false"

    partial = {"accuracy": 0.0, "binary": False, "eval_set": SET_A}
    worse, _ = _gate(tmp_path, base, "t3", {**partial, "mean_reward": 0.1})
    assert (worse.decision, worse.registry_decision) == ("skipped", "eval-worse")
    assert worse.tags["rollflow.registry.metric"] == "mean_reward"
    assert "0.1000 < incumbent v1 mean reward 0.2000" in worse.detail
