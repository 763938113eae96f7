"""A short `make demo`: the async-rl flow on the tiny config, through a real Prefect server.

Asserts the run completes, the trainer consumed trajectories produced by at least two policy versions,
accuracy on held-out prompts rose, MLflow holds the run, and the Prefect artifacts exist; and the same
run training LoRA adapters, registered with their base and merged (issue 20).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rollflow.clock.roles import ROLE_STATES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _short_run(tmp_path: Path, *extra: str) -> tuple[str, list[str]]:
    """(MLflow URI, overrides) of a 30-step run of the tiny config kept under ``tmp_path``."""
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri={mlflow_uri}",
        *extra,
        "train.steps=30",
        "eval.every_n_versions=10",
        "eval.n_prompts=100",
    ]
    return mlflow_uri, overrides


def test_async_rl_learns_and_reports(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.async_rl import async_rl
    from storage.fs import Storage
    from storage.shard_reader import ShardReader

    monkeypatch.chdir(ROOT)
    mlflow_uri, overrides = _short_run(tmp_path)
    summary = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides, trial="flow-test")

    assert summary["final_version"] == 30
    assert summary["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.2, summary
    assert summary["train"]["groups_consumed"] >= 30 * 16

    # Trajectories from several policy versions reached the trainer (the loops really overlapped).
    storage = Storage.open(str(tmp_path / "storage"), "tiny-arith", "flow-test")
    reader = ShardReader(storage)
    taken = reader.take(10_000)
    head_versions = {g.head_version for g in taken.groups}
    assert len(head_versions) >= 2, head_versions

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "30"
    for name in ("train/loss", "train/reward_mean", "eval/accuracy", "rollout/tokens_per_s"):
        assert client.get_metric_history(run.info.run_id, name), f"metric {name} was not logged"
    # Where the time went: every role's states add up to its wall time, the cores were read, and the
    # timeline (JSON + picture) is an artifact of the run.
    time_metrics = run.data.metrics
    for role, states in (("trainer", ("waiting_data", "computing", "publishing", "other")),
                         ("rollout", ROLE_STATES["rollout"])):  # fmt: skip
        assert sum(time_metrics[f"time/{role}/{s}_frac"] for s in states) == pytest.approx(1.0, abs=1e-6)
    assert time_metrics["time/trainer/computing_frac"] > 0 and "time/cpu/busy_frac_min" in time_metrics
    assert 0 < time_metrics["time/server0/busy_frac"] <= 1
    assert "trainer computing" in summary["time_bounds"]
    timeline = client.download_artifacts(run.info.run_id, "timing", str(tmp_path / "timing"))
    doc = json.loads((Path(timeline) / "timeline.json").read_text())
    assert {"trainer", "rollout", "weights", "eval"} <= doc["roles"].keys()
    assert doc["versions"][-1][1] == 30 and doc["samples"]
    assert (Path(timeline) / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    versions = client.search_model_versions("name = 'tiny-arith-policy'")
    assert versions and versions[0].tags["policy_version"] == "30"
    assert versions[0].tags["prefect.flow_run_id"] == run.data.tags["prefect.flow_run_id"]
    # the link is the flow run's page on the user's Prefect server (issue 21 §3)
    page = f"{use_prefect_server.removesuffix('/api')}/runs/flow-run/{run.data.tags['prefect.flow_run_id']}"
    assert versions[0].tags["prefect.flow_run_url"] == run.data.tags["prefect.flow_run_url"] == page
    assert run.data.tags["rollflow.registry.reason"] == "first-version"
    assert run.data.tags["mlflow.source.git.commit"] and run.data.tags["rollflow.data_window"].startswith(
        "synthetic:"
    )
    assert summary["mlflow_run_url"].startswith("http") and run.info.run_id in summary["mlflow_run_url"]

    # Re-running the finished trial is an explicit resume that changes nothing.
    from rollflow.api.errors import TrialExistsError

    with pytest.raises(TrialExistsError):
        async_rl(config="configs/tiny_cpu.yaml", overrides=overrides, trial="flow-test")
    curve = client.download_artifacts(run.info.run_id, "plots/reward_accuracy.png", str(tmp_path / "c1"))
    n_metric = len(client.get_metric_history(run.info.run_id, "train/loss"))
    again = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides, trial="flow-test", resume=True)
    assert again["already_finished"] and again["final_version"] == 30
    assert len(client.search_model_versions("name = 'tiny-arith-policy'")) == len(versions)
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == n_metric
    curve2 = client.download_artifacts(run.info.run_id, "plots/reward_accuracy.png", str(tmp_path / "c2"))
    assert Path(curve).read_bytes() == Path(curve2).read_bytes()

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as pc:
        keys = {a.key for a in pc.read_artifacts()}
    assert {"train-progress", "async-rl-summary", "eval-after", "sample-trajectories"} <= keys, keys

    # The nightly retrain starts a new trial from the newest registered policy (not the base model).
    nightly = async_rl(
        config="configs/tiny_cpu.yaml",
        overrides=[*overrides, "train.steps=2", "eval.every_n_versions=0"],
        trial="nightly-{date}",
        retrain_from_registry=True,
    )
    assert (
        nightly["trial"] == f"nightly-{time.strftime('%Y%m%d', time.gmtime())}"
        and nightly["final_version"] == 2
    )
    assert nightly["source_model_version"] == "1"
    # it begins where the registered policy ended, far above the base model's accuracy
    assert nightly["eval_accuracy_before"] >= summary["eval_accuracy_after"] - 0.1, nightly
    # the registry moved only if the retrain held the eval of the policy it started from
    n_versions = len(client.search_model_versions("name = 'tiny-arith-policy'"))
    held = nightly["eval_accuracy_after"] >= nightly["eval_accuracy_before"]
    assert n_versions == (2 if held else 1), nightly
    assert nightly["registry_decision"] == (
        "eval-tied"
        if nightly["eval_accuracy_after"] == nightly["eval_accuracy_before"]
        else "eval-improved"
        if held
        else "eval-worse"
    )
    # the incumbent was re-scored on the retrain's prompts (its "before"), and the run's tags say so
    tags = client.get_run(nightly["mlflow_run_id"]).data.tags
    assert tags["rollflow.registry.incumbent_rescored"] == "true"
    assert tags["rollflow.registry.incumbent_accuracy"] == f"{nightly['eval_accuracy_before']:.4f}"
    assert tags["rollflow.registry.incumbent_registered_accuracy"] == f"{summary['eval_accuracy_after']:.4f}"
    assert "re-scored on this run's eval prompts" in tags["rollflow.registry.detail"]


def test_a_lora_run_trains_adapters_registers_them_and_a_retrain_starts_from_them(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LoRA through the whole flow (issue 20): ``make demo DEMO_CONFIG=configs/tiny_cpu.yaml
    ARGS="train.lora.rank=8 train.lr=3e-4"`` with the real CPU server hot-loading each published adapter,
    then the registry gate: the published versions are adapters, held-out accuracy rises, the adapter is
    registered with its base's identity and the merged model beside it, and a nightly retrain from it
    starts where the LoRA run ended."""
    from mlflow.tracking import MlflowClient

    from flows.async_rl import async_rl
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    # LoRA's lr is 10x full fine-tuning's (docs/lora.md)
    mlflow_uri, overrides = _short_run(tmp_path, "experiment=tiny-lora", "train.lora.rank=8", "train.lr=3e-4")
    summary = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides, trial="lora")

    assert summary["final_version"] == 30
    assert summary["eval_accuracy_after"] >= summary["eval_accuracy_before"] + 0.2, summary
    store = CheckpointStore(Storage.open(str(tmp_path / "storage"), "tiny-lora", "lora"))
    record = store.get(30)  # older versions are pruned; every publish goes through the same code
    assert record.is_adapter
    assert "adapter_model.safetensors" in record.files and "model.safetensors" not in record.files

    client = MlflowClient(mlflow_uri)
    tags = client.get_run(summary["mlflow_run_id"]).data.tags
    assert (tags["rollflow.registry.decision"], tags["rollflow.registry.reason"]) == (
        "registered",
        "first-version",
    )
    assert tags["rollflow.registry.merged_model"] == "tiny-lora-policy-merged v1"
    adapter = client.get_model_version_by_alias("tiny-lora-policy", "latest-rl")
    assert (adapter.tags["lora_rank"], adapter.tags["policy_version"]) == ("8", "30")
    assert Path(adapter.tags["lora_base_model"]).is_dir() and adapter.tags["lora_base_model_blake3"]
    merged = client.get_model_version_by_alias("tiny-lora-policy-merged", "latest-rl")
    assert merged.tags["merged_from"] == "tiny-lora-policy v1"

    nightly = async_rl(
        config="configs/tiny_cpu.yaml",
        overrides=[*overrides, "train.steps=2", "eval.every_n_versions=0"],
        trial="nightly",
        retrain_from_registry=True,
    )
    assert nightly["source_model_version"] == "1" and nightly["final_version"] == 2
    assert nightly["eval_accuracy_before"] >= summary["eval_accuracy_after"] - 0.1, nightly
