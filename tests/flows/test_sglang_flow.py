"""The async-rl flow on SGLang's real server (``inference.backend=sglang`` on the tiny config, CPU), through a
real Prefect server: it trains, serves every published version, registers the model, and a resume continues
the trial on a new SGLang server.

The server flags come from the config alone (device auto -> cpu here, torch_native attention, the model's
float32, a bounded KV pool; ``.venv-sglang``'s Python): the overrides below name only the backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_async_rl_on_sglang_learns_serves_every_version_and_resumes(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from flows.async_rl import async_rl
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri={mlflow_uri}",
        "inference.backend=sglang",
        "eval.every_n_versions=10",
        "eval.n_prompts=100",
    ]
    summary = async_rl(config="configs/tiny_cpu.yaml", overrides=[*where, "train.steps=30"], trial="sg")
    assert summary["final_version"] == 30
    assert summary["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.2, summary

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["inference.backend"] == "sglang"
    served = {int(m.value) for m in client.get_metric_history(run.info.run_id, "rollout/watcher/version")}
    assert served == set(range(31)), sorted(set(range(31)) - served)  # every published version was served
    assert client.search_model_versions("name = 'tiny-arith-policy'")

    # A resume: the trial continues from its resume point on a freshly launched SGLang server.
    storage = Storage.open(str(tmp_path / "storage"), "tiny-arith", "sg")
    storage.delete("trainer/DONE.json")
    storage.delete("FINALIZED.json")
    again = async_rl(
        config="configs/tiny_cpu.yaml", overrides=[*where, "train.steps=40"], trial="sg", resume=True
    )
    assert again["final_version"] == 40 and not again.get("already_finished")
    assert again["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.2, again
    resumed = client.get_run(again["mlflow_run_id"])
    served = {int(m.value) for m in client.get_metric_history(resumed.info.run_id, "rollout/watcher/version")}
    assert set(range(31, 41)) <= served, sorted(set(range(31, 41)) - served)
