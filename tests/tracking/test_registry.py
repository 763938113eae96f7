"""The registry gate (hand-checked cases) and the transformers-flavour model, on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollflow.configuration.loader import load_config
from rollflow.tracking.mlflow_tracker import MlflowTracker, download_latest_registered
from rollflow.tracking.registry import Incumbent, decide_registration, incumbent_tags


def test_gate_registers_only_trained_runs_that_hold_the_eval() -> None:
    inc = Incumbent("3", 0.50, {})
    assert decide_registration(steps_trained=0, eval_accuracy=0.9, incumbent=inc).reason == "no-training"
    assert decide_registration(steps_trained=5, eval_accuracy=0.1, incumbent=None).reason == "first-version"
    d = decide_registration(steps_trained=5, eval_accuracy=0.49, incumbent=inc)
    assert (d.register, d.reason) == (False, "eval-worse") and "v3" in d.detail
    assert decide_registration(steps_trained=5, eval_accuracy=0.50, incumbent=inc).reason == "eval-tied"
    d = decide_registration(steps_trained=1, eval_accuracy=0.51, incumbent=inc)
    assert (d.register, d.reason) == (True, "eval-improved")
    # an incumbent registered without a score is beaten by any trained run
    assert decide_registration(
        steps_trained=1, eval_accuracy=0.0, incumbent=Incumbent("1", None, {})
    ).register


def test_a_rescored_incumbent_is_explained_with_both_numbers() -> None:
    """The nightly's case (issue 21): v1 was registered with 0.9900; re-scored on the retrain's prompts it
    gets 0.9950, and the retrain's 0.9850 loses to that, which the detail and the tags must say."""
    registered = Incumbent("1", 0.99, {"eval_accuracy": "0.9900"})
    inc = registered.rescore(0.995)
    d = decide_registration(steps_trained=2, eval_accuracy=0.985, incumbent=inc)
    assert (d.register, d.reason) == (False, "eval-worse")
    assert d.detail == (
        "eval accuracy 0.9850 < incumbent v1 0.9950 (re-scored on this run's eval prompts; registered with "
        "0.9900); registry unchanged"
    )
    assert incumbent_tags(inc) == {
        "rollflow.registry.incumbent_version": "1",
        "rollflow.registry.incumbent_accuracy": "0.9950",
        "rollflow.registry.incumbent_rescored": "true",
        "rollflow.registry.incumbent_registered_accuracy": "0.9900",
        "rollflow.registry.incumbent_note": (
            "v1 was re-scored on this run's held-out prompts (the run started from it): 0.9950; "
            "registered with 0.9900"
        ),
    }
    d = decide_registration(steps_trained=2, eval_accuracy=0.995, incumbent=inc)
    assert d.reason == "eval-tied" and "re-scored" in d.detail and "0.9900" in d.detail
    # judged by the score it was registered with: no re-scoring said, nothing extra tagged
    d = decide_registration(steps_trained=2, eval_accuracy=0.985, incumbent=registered)
    assert d.detail == "eval accuracy 0.9850 < incumbent v1 0.9900; registry unchanged"
    assert incumbent_tags(registered) == {
        "rollflow.registry.incumbent_version": "1",
        "rollflow.registry.incumbent_accuracy": "0.9900",
    }
    unscored = Incumbent("2", None, {}).rescore(0.5)
    assert (
        "registered without a score"
        in decide_registration(steps_trained=1, eval_accuracy=0.4, incumbent=unscored).detail
    )


def _tiny_checkpoint(path: Path) -> Path:
    """The tiny model and tokenizer plus rollflow's internal files, as a fetched checkpoint looks."""
    from rollflow.models.random_llama import save_random_llama
    from rollflow.models.tokenizer import build_tokenizer

    save_random_llama(path, tokenizer=build_tokenizer())
    (path / ".rollflow-verified.json").write_text("{}")
    (path / "COMMIT.json").write_text("{}")
    return path


@pytest.mark.slow
def test_registered_policy_is_a_transformers_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    import mlflow.transformers
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    cfg = load_config(overrides=[f"tracking.mlflow_tracking_uri={uri}", "experiment=reg", "trial=t1"])
    tracker = MlflowTracker(cfg)
    tracker.start()
    tracker.log_table([{"prompt": "1+1=", "reward": 1.0}], "trajectories/samples.json")
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    assert tracker.register_checkpoint(ckpt, version=7, extra_tags={"eval_accuracy": "0.5"}) == "1"
    tracker.finish()

    client = MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert "mlflow.loggedArtifacts" not in run.data.tags  # not filed as a GenAI evaluation run
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    mlflow.set_tracking_uri(uri)
    pipe = mlflow.transformers.load_model("models:/reg-policy/1")
    assert pipe.model.config.hidden_size == 32 and pipe.tokenizer is not None
    local = Path(mlflow.artifacts.download_artifacts("models:/reg-policy/1", dst_path=str(tmp_path / "dl")))
    names = {p.name for p in local.rglob("*")}
    assert "MLmodel" in names and "model.safetensors" in names
    assert ".rollflow-verified.json" not in names and "COMMIT.json" not in names
    inc = tracker.registry.incumbent()
    assert inc is not None and (inc.version, inc.eval_accuracy) == ("1", 0.5)
    # a retrain downloads one Hugging Face directory
    hf, tags = download_latest_registered(uri, "reg-policy", tmp_path / "retrain")
    assert (
        tags["policy_version"] == "7" and (hf / "config.json").exists() and (hf / "tokenizer.json").exists()
    )
