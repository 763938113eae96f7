"""The user's path end to end: a real Prefect server, a process worker, `prefect deploy`, and
`prefect deployment run 'async-rl/local'` reaching Completed; then a cancelled run leaves no orphans."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _prefect(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


TAG = "ROLLFLOW_TEST_TAG=deployment-test"


def _tagged_server_pids() -> list[int]:
    """CPU inference servers started (transitively) by this test's worker: they inherit TAG."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"cpu_server" in cmdline and TAG.encode() in environ.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def _flow_run_state(env: dict[str, str], flow_run_id: str) -> str:
    out = _prefect(env, "flow-run", "inspect", flow_run_id, "--output", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["state"]["type"]


def test_deploy_run_and_cancel(
    prefect_server: str, prefect_env: dict[str, str], stop_process_group: Callable[..., None], tmp_path: Path
) -> None:
    env = dict(prefect_env)
    env[TAG.split("=")[0]] = TAG.split("=")[1]
    for pool, kind, template in (
        ("rollflow-local", "process", None),
        ("rollflow-gpu-docker", "docker", "infra/work_pools/docker-gpu.json"),
        ("rollflow-gpu-k8s", "kubernetes", "infra/work_pools/kubernetes-gpu.json"),
    ):
        args = ["work-pool", "create", pool, "--type", kind]
        if template:
            args += ["--base-job-template", template]
        res = _prefect(env, *args)
        assert res.returncode == 0, res.stdout + res.stderr
    res = _prefect(env, "deploy", "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    for name in (
        "async-rl/local",
        "async-rl/gpu",
        "rollout/gpu",
        "train/gpu",
        "evaluate/local",
        "async-rl/nightly",
    ):
        assert (
            f"'{name}' successfully created" in res.stdout.replace("\n", " ").replace("│", " ")
            or name in res.stdout
        )

    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (outlives this block)
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", "rollflow-local"],
        env=env, cwd=ROOT, stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        root = tmp_path / "storage"
        overrides = [
            "train.steps=4",
            "trial=deploy-test",
            f"storage.root={root}",
            f"storage.local_cache={tmp_path / 'cache'}",
            f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "eval.n_prompts=32",
            "eval.every_n_versions=0",
        ]
        res = _prefect(
            env, "deployment", "run", "async-rl/local",
            "--param", f"overrides={json.dumps(overrides)}",
            "--watch", "--watch-interval", "2", "--watch-timeout", "420",
            timeout=480,
        )  # fmt: skip
        assert res.returncode == 0, (
            res.stdout[-3000:] + res.stderr[-3000:] + (tmp_path / "worker.log").read_text()[-5000:]
        )
        assert "Completed" in res.stdout, res.stdout[-3000:]
        assert (root / "tiny-arith" / "deploy-test" / "trainer" / "DONE.json").exists()

        # Cancel a long run once its servers are up: the run ends Cancelled and no server survives.
        marker = str(tmp_path / "cancel-storage")
        long = [*overrides[:1], "train.steps=10000", "trial=cancel-test", f"storage.root={marker}"]
        res = _prefect(env, "deployment", "run", "async-rl/local", "--param", f"overrides={json.dumps(long)}")
        assert res.returncode == 0, res.stderr
        run_id = next(line.split()[-1] for line in res.stdout.splitlines() if "UUID" in line)
        deadline = time.monotonic() + 240
        while not (Path(marker) / "tiny-arith" / "cancel-test" / "checkpoints" / "LATEST").exists():
            assert time.monotonic() < deadline, "the long run never published a checkpoint"
            time.sleep(1)
        assert _tagged_server_pids(), "expected a running CPU inference server"
        res = _prefect(env, "flow-run", "cancel", run_id)
        assert res.returncode == 0, res.stdout + res.stderr
        deadline = time.monotonic() + 120
        while _flow_run_state(env, run_id) not in ("CANCELLED", "CRASHED", "FAILED"):
            assert time.monotonic() < deadline, "flow run did not reach Cancelled"
            time.sleep(2)
        assert _flow_run_state(env, run_id) == "CANCELLED"
        deadline = time.monotonic() + 30
        while _tagged_server_pids():
            assert time.monotonic() < deadline, "inference servers outlived the cancelled flow run"
            time.sleep(1)
    finally:
        stop_process_group(worker)
