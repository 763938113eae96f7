"""The GPU path resolves without a GPU: config, SGLang commands, torchrun command, pool job variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.gpu_plan import MissingImageError, deployment_variables, gpu_plan
from tasks.runtime import HUB_OFFLINE_ENV, process_env_defaults

ROOT = Path(__file__).resolve().parents[2]
GPU = str(ROOT / "configs" / "gsm8k_qwen.yaml")


def test_gsm8k_plan_resolves_every_command_and_pool_variable() -> None:
    plan = gpu_plan(GPU, ["inference.sglang.tp_size=2", "inference.n_servers=2"], image="reg/rollflow:gpu")
    assert "experiment: gsm8k-qwen" in plan["config"]
    cmds = plan["sglang_commands"]
    assert len(cmds) == 2
    for i, cmd in enumerate(cmds):
        assert cmd[1:3] == ["-m", "sglang.launch_server"]
        assert cmd[cmd.index("--model-path") + 1] == "Qwen/Qwen2.5-1.5B-Instruct"
        assert cmd[cmd.index("--tp-size") + 1] == "2"
        assert cmd[cmd.index("--base-gpu-id") + 1] == str(2 * i)  # server i on GPUs 2i, 2i+1
        assert cmd[cmd.index("--port") + 1] == str(30000 + i)
    torchrun = plan["torchrun_command"]
    assert torchrun[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node=8" in torchrun
    assert torchrun[-2:] == ["inference.sglang.tp_size=2", "inference.n_servers=2"]
    jv = plan["job_variables"]
    assert jv["rollout"]["gpu_count"] == 4  # n_servers x tp_size
    assert jv["train"]["gpu_count"] == 8 and jv["train"]["image"] == "reg/rollflow:gpu"


def test_missing_image_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLFLOW_IMAGE", raising=False)
    with pytest.raises(MissingImageError, match="ROLLFLOW_IMAGE"):
        deployment_variables(GPU)
    monkeypatch.setenv("ROLLFLOW_IMAGE", "reg/rollflow:gpu")
    monkeypatch.delenv("ROLLFLOW_CONFIG", raising=False)
    assert deployment_variables(GPU) == {
        "config": GPU,
        "image": "reg/rollflow:gpu",
        "rollout_gpu_count": 4,
        "train_gpu_count": 8,
        "train_nnodes": 1,
        "eval_gpu_count": 1,
    }


def test_offline_defaults_only_for_the_embedded_default() -> None:
    from rollflow.configuration.loader import load_config

    gpu = process_env_defaults(load_config(GPU))
    assert not set(HUB_OFFLINE_ENV) & set(gpu), "a hub model and dataset must not be forced offline"
    assert gpu["DO_NOT_TRACK"] == "true"
    tiny = process_env_defaults(load_config(str(ROOT / "configs" / "tiny_cpu.yaml")))
    assert tiny["HF_HUB_OFFLINE"] == "1" and tiny["TRANSFORMERS_OFFLINE"] == "1"


def test_the_plan_resolves_the_config_as_the_async_rl_gpu_deployment_does() -> None:
    """prefect-gpu.yaml's async-rl/gpu passes orchestration.mode=distributed: the plan must show that mode."""
    import yaml

    from flows.gpu_plan import DEPLOYMENT_OVERRIDES

    deployments = yaml.safe_load((ROOT / "prefect-gpu.yaml").read_text())["deployments"]
    (parent,) = [d for d in deployments if d["entrypoint"] == "flows/async_rl.py:async_rl"]
    assert list(DEPLOYMENT_OVERRIDES) == parent["parameters"]["overrides"]
    plan = gpu_plan(GPU, image="reg/rollflow:gpu")
    assert "  mode: distributed\n" in plan["config"]
    assert "orchestration: distributed" in plan["summary"] and "image:   reg/rollflow:gpu" in plan["summary"]
