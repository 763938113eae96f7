"""The GPU recipes resolve without a GPU: the one-node config, the GPU count the docs quote, one
evaluation server in distributed mode, and prefect-gpu.yaml taking its config as a parameter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.gpu_plan import gpu_plan, torchrun_command, total_gpus
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
GSM8K = str(ROOT / "configs" / "gsm8k_qwen.yaml")
ONE_NODE = str(ROOT / "configs" / "qwen_1node.yaml")


def test_one_node_recipe_is_embedded_on_two_gpus_without_an_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_IMAGE", raising=False)
    cfg = load_config(ONE_NODE)
    assert cfg.orchestration.mode == "embedded" and cfg.inference.backend == "sglang"
    assert cfg.storage.root == "runs/storage" and cfg.dataset.hub_config == "main"
    plan = gpu_plan(ONE_NODE)
    assert plan["gpus"] == {"rollout": 1, "train": 1, "eval": 0, "total": 2}
    summary = plan["summary"].splitlines()
    assert "  GPUs:    2 (1 inference + 1 train)" in summary
    assert not any("WARNING" in ln for ln in summary)  # the server starts on GPU 1, the trainer has GPU 0
    (cmd,) = plan["sglang_commands"]
    assert cmd[cmd.index("--base-gpu-id") + 1] == "1" and plan["job_variables"] == {}
    # the same file with the server on GPU 0 is flagged
    shared = gpu_plan(ONE_NODE, ["inference.sglang.base_gpu_id=0", "inference.n_servers=3"])
    assert shared["gpus"]["total"] == 4 and "shares GPU 0 with the trainer" in shared["summary"]


def test_the_cli_prints_the_one_node_plan() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "plan", "--config", "configs/qwen_1node.yaml"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        out.stdout.startswith("GPU plan for configs/qwen_1node.yaml")
        and "orchestration: embedded" in out.stdout
    )


def test_distributed_gpu_count_is_rollout_plus_train_plus_one_eval_server() -> None:
    cfg = load_config(GSM8K, ["orchestration.mode=distributed", "orchestration.n_rollout_workers=2"])
    # 2 workers x 4 servers x tp 1 + 8 train + 1 eval server = 17 (was 2 x 4 + 8 + 4 = 20)
    assert total_gpus(cfg) == {"rollout": 8, "train": 8, "eval": 1, "total": 17}
    tp2 = load_config(GSM8K, ["orchestration.mode=distributed", "inference.sglang.tp_size=2"])
    assert total_gpus(tp2) == {"rollout": 8, "train": 8, "eval": 2, "total": 18}
    plan = gpu_plan(GSM8K, image="reg/r:gpu")
    assert plan["job_variables"]["parent"]["gpu_count"] == 1 and plan["gpus"]["total"] == 13


def test_the_distributed_parent_starts_one_evaluation_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import flows.distributed as dist

    started: list[Any] = []

    class Started(Exception):
        pass

    def fake_start(cfg: Any, model_path: str) -> None:
        started.append(cfg)
        raise Started

    monkeypatch.setattr(dist, "bootstrap_model", lambda cfg: "model-dir")
    monkeypatch.setattr(dist, "start_servers", fake_start)
    cfg = load_config(
        GSM8K, ["orchestration.mode=distributed", f"storage.root={tmp_path}", "storage.options={}"]
    )
    assert cfg.inference.n_servers == 4
    with pytest.raises(Started):
        dist.run_distributed(cfg, {"config": GSM8K, "overrides": []}, None)
    (eval_cfg,) = started
    assert eval_cfg.inference.n_servers == 1 and eval_cfg.inference.sglang.tp_size == 1
    assert cfg.inference.n_servers == 4  # the rollout workers' own setting is untouched


def test_prefect_gpu_yaml_takes_the_config_as_a_parameter() -> None:
    doc = yaml.safe_load((ROOT / "prefect-gpu.yaml").read_text())
    text = json.dumps(doc["deployments"])
    assert "configs/" not in text and "ROLLFLOW_PROJECT_DIR" not in text
    for d in doc["deployments"]:
        assert d["parameters"]["config"] == "{{ gpu.config }}", d["entrypoint"]
        assert d["work_pool"]["name"] != "rollflow-local", d["entrypoint"]  # every part runs in the image
        assert d["work_pool"]["job_variables"]["image"] == "{{ gpu.image }}"
    (parent,) = [d for d in doc["deployments"] if d["entrypoint"] == "flows/async_rl.py:async_rl"]
    assert parent["work_pool"]["job_variables"]["gpu_count"] == "{{ gpu.eval_gpu_count }}"


def test_deployment_variables_read_the_config_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.gpu_plan import deployment_variables

    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "inference: {backend: sglang, n_servers: 2, sglang: {tp_size: 2}}\n"
        "train: {distributed: fsdp2, nproc_per_node: 4, nnodes: 2, rdzv_endpoint: 'head:29400'}\n"
    )
    monkeypatch.setenv("ROLLFLOW_IMAGE", "reg/mine:gpu")
    monkeypatch.setenv("ROLLFLOW_CONFIG", str(mine))
    assert deployment_variables() == {
        "config": str(mine), "image": "reg/mine:gpu", "rollout_gpu_count": 4, "train_gpu_count": 4,
        "train_nnodes": 2, "eval_gpu_count": 2,
    }  # fmt: skip
    monkeypatch.delenv("ROLLFLOW_CONFIG")
    assert deployment_variables()["config"] == "configs/gsm8k_qwen.yaml"


def test_multi_node_torchrun_line_and_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_RDZV_ENDPOINT", raising=False)
    over = ["train.nnodes=2", "experiment=e", "trial=t"]
    cfg = load_config(GSM8K, over)
    with pytest.raises(ConfigError, match="train.rdzv_endpoint"):
        torchrun_command(cfg, GSM8K, [])
    cfg = load_config(GSM8K, [*over, "train.rdzv_endpoint=node0:29400"])
    cmd = torchrun_command(cfg, GSM8K, [])
    assert cmd[3:9] == [
        "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400", "--rdzv_id=e-t",
        "--rdzv_conf=join_timeout=1800", "--nproc_per_node=8",
    ]  # fmt: skip
    monkeypatch.setenv("ROLLFLOW_RDZV_ENDPOINT", "job-0.rollflow-train:29400")  # the k8s pool's, per job
    assert "--rdzv_endpoint=job-0.rollflow-train:29400" in torchrun_command(cfg, GSM8K, [])
    plan = gpu_plan(GSM8K, over, image="reg/r:gpu")
    assert plan["gpus"]["train"] == 16 and plan["gpus"]["total"] == 4 + 16 + 1
    assert (
        "2 nodes x torchrun --nproc_per_node=8 (fsdp2), c10d rendezvous at job-0.rollflow-train:29400"
        in (plan["summary"])
    )
    with pytest.raises(ConfigError, match="train.nnodes"):
        load_config(GSM8K, ["train.nnodes=2", "train.distributed=none"])
