"""`prefect deploy --prefect-file prefect-gpu.yaml` against a real Prefect server: the config is a
parameter ($ROLLFLOW_CONFIG), and its GPU counts size every pool, the parent's evaluation server and the
trainer's node count included. Nothing runs: the deployments are only created and read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
POOLS = (
    ("rollflow-gpu-docker", "docker", "infra/work_pools/docker-gpu.json"),
    ("rollflow-gpu-k8s", "kubernetes", "infra/work_pools/kubernetes-gpu.json"),
)


def test_gpu_deployments_take_the_config_from_the_environment(
    prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL, temporary_settings

    mine = tmp_path / "my_run.yaml"
    mine.write_text(
        "inference: {backend: sglang, n_servers: 2, sglang: {tp_size: 2}}\n"
        "train: {distributed: fsdp2, nproc_per_node: 4, nnodes: 2}\n"
    )
    with temporary_settings({PREFECT_API_URL: prefect_server}), get_client(sync_client=True) as pc:
        for pool, kind, template in POOLS:
            try:
                job = json.loads((ROOT / template).read_text())
                pc.create_work_pool(WorkPoolCreate(name=pool, type=kind, base_job_template=job))
            except ObjectAlreadyExists:
                pass
    env = {**prefect_env, "ROLLFLOW_IMAGE": "reg/my-rl:gpu", "ROLLFLOW_CONFIG": str(mine)}
    res = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "prefect-gpu.yaml"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    expected = {"async-rl/gpu": 2, "rollout/gpu": 4, "train/gpu": 4}  # eval: one server of tp 2
    with temporary_settings({PREFECT_API_URL: prefect_server}), get_client(sync_client=True) as pc:
        for name, gpus in expected.items():
            d = pc.read_deployment_by_name(name)
            assert d.parameters["config"] == str(mine), (name, d.parameters)
            assert d.job_variables["gpu_count"] == gpus and d.job_variables["image"] == "reg/my-rl:gpu", name
        assert pc.read_deployment_by_name("train/gpu").job_variables["nnodes"] == 2
        assert pc.read_deployment_by_name("async-rl/gpu").work_pool_name == "rollflow-gpu-docker"


def test_docker_pool_takes_storage_and_mlflow_from_prefect_at_run_time(
    prefect_server: str, tmp_path: Path
) -> None:
    """The Docker GPU pool resolves the storage credentials (Secret blocks) and the storage and MLflow
    endpoints (Variables) when a worker starts a container, as Prefect resolves a base job template: the
    deployment holds none of them, and its own env (the role) is merged over them. A config that named a
    cluster's DNS (`*.svc`) could not be reached from Docker's bridge network; the shipped one names none."""
    import asyncio

    from prefect.blocks.system import Secret
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import VariableCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.base import BaseJobConfiguration

    template = json.loads((ROOT / "infra/work_pools/docker-gpu.json").read_text())
    deployment_vars = {"image": "reg/rollflow:gpu", "gpu_count": 2, "env": {"ROLLFLOW_ROLE": "rollout"}}
    with temporary_settings({PREFECT_API_URL: prefect_server}):
        Secret(value="AKIA-test-key").save("rollflow-storage-access-key-id", overwrite=True)
        Secret(value="test-secret-value").save("rollflow-storage-secret-access-key", overwrite=True)
        with get_client(sync_client=True) as pc:
            for name, value in (
                ("rollflow_storage_endpoint_url", "http://10.0.0.5:9000"),
                ("rollflow_mlflow_tracking_uri", "http://10.0.0.5:5000"),
            ):
                if pc.read_variable_by_name(name) is None:  # the session's server may have it already
                    pc.create_variable(VariableCreate(name=name, value=value))

        async def resolve() -> dict[str, str]:
            async with get_client() as client:
                cfg = await BaseJobConfiguration.from_template_and_values(
                    template, deployment_vars, client=client
                )
            return cfg.env

        env = asyncio.run(resolve())
    assert env == {
        "AWS_ACCESS_KEY_ID": "AKIA-test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret-value",
        "AWS_ENDPOINT_URL": "http://10.0.0.5:9000",
        "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000",
        "ROLLFLOW_ROLE": "rollout",
    }
    shipped = json.dumps(template) + (ROOT / "prefect-gpu.yaml").read_text()
    assert "test-secret-value" not in shipped and "AKIA" not in shipped
    config = (ROOT / "configs/gsm8k_qwen.yaml").read_text()
    assert ".svc" not in config and "endpoint_url" not in config
