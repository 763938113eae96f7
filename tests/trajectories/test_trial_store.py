"""The trajectory store from a config: `rollflow query` (in process), `RLRun.query`, and the viewer's
static page logged to the session's real MLflow server as `trajectories/viewer.html`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trajectory_testlib import small_trial

from flows.cli import main as cli
from rollflow.configuration.loader import load_config
from rollflow.trial.store import open_trial_storage


def _overrides(tmp_path: Path) -> list[str]:
    return [
        f"storage.root={tmp_path / 'store'}",
        "experiment=exp",
        f"model.path={tmp_path}",
    ]  # no tokenizer there


def test_cli_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    over = _overrides(tmp_path)
    small_trial(open_trial_storage(load_config(overrides=[*over, "trial=t1"])))
    sql = "SELECT version, trajectories, reward_mean FROM per_version"
    assert cli(["query", "t1", sql, "--format", "json", *over]) == 0  # overrides after the options too
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out == [
        {"version": 0, "trajectories": 4, "reward_mean": 0.75},
        {"version": 1, "trajectories": 2, "reward_mean": 0.0},
    ]
    assert cli(["query", "t1", sql, *over]) == 0
    assert "(2 rows)" in capsys.readouterr().out
    # a MAP column is a JSON object, as the table shows it (it was a list of [key, value] pairs)
    maps = "SELECT version, finish_reasons FROM per_version ORDER BY version"
    assert cli(["query", "t1", maps, "--format", "json", *over]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out == [
        {"version": 0, "finish_reasons": {"stop": 4}},
        {"version": 1, "finish_reasons": {"length": 2}},
    ]
    assert cli(["query", "t1", maps, *over]) == 0
    assert "{length: 2}" in capsys.readouterr().out
    assert cli(["query", "t1", "SELECT nope FROM per_version", *over]) == 2
    assert "rollflow query: error:" in capsys.readouterr().err
    assert cli(["query", "t-missing", sql, *over]) == 2
    assert "no such trial: t-missing" in capsys.readouterr().err
    # a trial under another experiment of the root (an RLRun trial) is found without experiment=
    elsewhere = [o for o in over if not o.startswith("experiment=")]
    assert cli(["query", "t1", "SELECT count(*) AS n FROM trajectories", "--format", "json", *elsewhere]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 6}


def test_rlrun_query(tmp_path: Path) -> None:
    from flows.session import RLRun

    over = _overrides(tmp_path)
    small_trial(open_trial_storage(load_config(overrides=[*over, "trial=t2"])))
    run = RLRun(config=dict(o.split("=", 1) for o in over), trial="t2")
    frame = run.query("SELECT group_id, staleness FROM groups WHERE staleness IS NOT NULL ORDER BY group_id")
    assert frame.to_dict("records") == [
        {"group_id": "g0", "staleness": 2},
        {"group_id": "g1", "staleness": 2},
    ]


def test_report_logged_to_mlflow(mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from rollflow.viewer.trial import trajectory_report

    uri = mlflow_server  # the session's `mlflow server` over HTTP
    cfg = load_config(overrides=[*_overrides(tmp_path), "trial=t3", f"tracking.mlflow_tracking_uri={uri}"])
    small_trial(open_trial_storage(cfg))
    tracker = MlflowTracker(cfg)
    run_id = tracker.start()
    tracker.log_html(trajectory_report(cfg, last_versions=2), "trajectories/viewer.html")
    tracker.finish()
    path = MlflowClient(uri).download_artifacts(run_id, "trajectories/viewer.html", str(tmp_path / "dl"))
    page = Path(path).read_text()
    assert page.startswith("<!DOCTYPE html>") and "exp / t3: trajectories" in page
    assert "The last 2 versions" in page and '<h2 id="v1">v1</h2>' in page and "<script" not in page
