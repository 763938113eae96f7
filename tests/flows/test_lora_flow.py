"""LoRA through the whole flow (issue 20): ``make demo DEMO_CONFIG=configs/tiny_cpu.yaml ARGS="train.lora.rank=8
train.lr=3e-4"`` as a flow run on a real Prefect server, the real CPU inference server hot-loading each
published adapter, and the registry gate at the end.

Asserts: the published versions are adapters (``adapter_model.safetensors``, no full weights), held-out
accuracy rises, the gate registers the adapter with its base's identity and the merged model beside it,
and a nightly retrain from that registry version starts from the adapter merged into its base (its
"before" is where the LoRA run ended, not the base model's accuracy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_a_lora_run_trains_adapters_registers_them_and_a_retrain_starts_from_them(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from flows.async_rl import async_rl
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri={mlflow_uri}",
        "experiment=tiny-lora",
        "train.lora.rank=8",
        "train.lr=3e-4",  # LoRA's lr: 10x full fine-tuning's (docs/lora.md)
        "train.steps=30",
        "eval.every_n_versions=10",
        "eval.n_prompts=100",
    ]
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
