"""MlflowTracker against a real `mlflow server` over HTTP and a real SQLite store."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import torch

from rollflow.configuration.loader import load_config
from rollflow.tracking.mlflow_tracker import MlflowTracker, download_latest_registered


def _tiny_hf_dir(path: Path) -> Path:
    from rollflow.models.random_llama import save_random_llama
    from rollflow.models.tokenizer import build_tokenizer

    return save_random_llama(path, tokenizer=build_tokenizer())


@pytest.mark.slow
def test_run_params_metrics_registry_over_http(mlflow_server: str, tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            f"tracking.mlflow_tracking_uri={mlflow_server}",
            "experiment=tracker-test",
            "trial=t1",
            "storage.options={key: AKIAHIDDEN, secret: hunter2}",
        ]
    )
    tracker = MlflowTracker(cfg)
    run_id = tracker.start()
    assert tracker.sink is not None
    for step in range(3):
        tracker.sink.log({"train/reward_mean": 0.1 * step, "eval/accuracy": 0.2 * step}, step=step)
    tracker.log_curves_png()
    tracker.log_table([{"prompt": "1+1=", "completion": "2", "reward": 1.0}], "trajectories/samples.json")
    ckpt = _tiny_hf_dir(tmp_path / "ckpt")
    reg_version = tracker.register_checkpoint(ckpt, version=3)
    tracker.finish()

    # Read it back over plain HTTP (the REST API), not through the tracker.
    req = urllib.request.Request(
        f"{mlflow_server}/api/2.0/mlflow/runs/get?run_id={run_id}",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        run = json.load(r)["run"]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["train.lr"] == str(cfg.train.lr)
    assert params["storage.options.key"] == "***" and params["storage.options.secret"] == "***"
    assert "hunter2" not in json.dumps(run) and "AKIAHIDDEN" not in json.dumps(run)
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert metrics["train/reward_mean"] == pytest.approx(0.2)  # last step logged: 0.1 * 2
    assert run["info"]["status"] == "FINISHED"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(run_id, "eval/accuracy")
    assert [m.step for m in history] == [0, 1, 2]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config", "plots", "trajectories"} <= artifacts
    # the policy is not a run artifact but the run's logged model (MLflow 3), found by searching
    (logged,) = client.search_logged_models([run["info"]["experiment_id"]])
    assert logged.source_run_id == run_id
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [logged.model_id]

    # The registered policy downloads and loads with transformers, tagged with its policy version.
    local, tags = download_latest_registered(mlflow_server, tracker.model_name, tmp_path / "dl")
    assert tags["policy_version"] == "3" and tags["registry_version"] == "1"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(local)
    ref = AutoModelForCausalLM.from_pretrained(ckpt)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    assert reg_version == "1"


def test_sqlite_default_store_and_same_trial_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(overrides=["experiment=sqlite-test", "trial=t1"])
    tracker = MlflowTracker(cfg, base_dir=tmp_path / "mlflow")
    assert tracker.tracking_uri.startswith("sqlite:///")
    first = tracker.start()
    tracker.sink.log({"train/loss": 1.5}, step=1)
    tracker.finish()
    again = MlflowTracker(cfg, base_dir=tmp_path / "mlflow")
    assert again.start() == first  # a restarted trial continues its run, it does not fork a new one
    again.finish()
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(tracker.tracking_uri).get_metric_history(first, "train/loss")
    assert [(m.step, m.value) for m in hist] == [(1, 1.5)]
    # artifacts live beside the database, never under the current directory
    assert tracker._artifact_location == (tmp_path / "mlflow" / "artifacts").as_uri()


def test_sqlite_uri_keeps_artifacts_beside_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "elsewhere" / "db" / "mlflow.db"
    cfg = load_config(
        overrides=[f"tracking.mlflow_tracking_uri=sqlite:///{db}", "experiment=beside", "trial=t"]
    )
    tracker = MlflowTracker(cfg)
    tracker.start()
    tracker.log_dict({"a": 1}, "x/a.json")
    tracker.finish()
    assert (db.parent / "artifacts").is_dir()
    assert list((db.parent / "artifacts").rglob("a.json"))
    assert not (tmp_path / "runs").exists(), "nothing may land under the current directory"
    assert tracker.run_url.startswith("http://127.0.0.1:5000/#/experiments/")
    assert tracker.run_url.endswith(f"/runs/{tracker.run_id}")
