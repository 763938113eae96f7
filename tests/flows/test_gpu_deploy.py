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
