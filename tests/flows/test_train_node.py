"""A trainer node k > 0 reads its flow run's parameters from the Prefect API and runs node 0's torchrun line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flows.gpu_plan import torchrun_command
from flows.train_node import flow_run_parameters, node_command
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
GSM8K = str(ROOT / "configs" / "gsm8k_qwen.yaml")
TWO_NODES = ["train.nnodes=2", "train.rdzv_endpoint=trainer-0.rollflow-train:29400"]


def test_node_k_runs_the_line_of_node_0(use_prefect_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client

    from flows.train import train

    monkeypatch.delenv("ROLLFLOW_RDZV_ENDPOINT", raising=False)
    with get_client(sync_client=True) as client:  # the flow run the pool's pods belong to
        run = client.create_flow_run(train, parameters={"config": GSM8K, "overrides": TWO_NODES})
    params = flow_run_parameters(str(run.id))
    assert params["config"] == GSM8K and params["overrides"] == TWO_NODES
    cmd = node_command(params)
    assert cmd == torchrun_command(load_config(GSM8K, TWO_NODES), GSM8K, TWO_NODES)
    assert "--nnodes=2" in cmd and "--rdzv_endpoint=trainer-0.rollflow-train:29400" in cmd
    with pytest.raises(ConfigError, match="train.nnodes"):  # one node has no node k > 0
        node_command({"config": GSM8K, "overrides": []})


def test_without_a_flow_run_id_it_says_so() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flows.train_node"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode == 2 and "PREFECT__FLOW_RUN_ID is not set" in out.stderr
