"""A command-line run stopped from outside: SIGTERM ends it with the MLflow run KILLED, and SIGKILL of
the flow process leaves no orphan (inference servers, reward workers, nor the private Prefect API server)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _tagged(tag: str) -> dict[int, str]:
    """pid -> command line of the processes that carry ``tag`` in their environment."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag.encode() in environ:
            found[int(proc.name)] = cmdline
    return found


def _start(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    tag = f"ROLLFLOW_TEST_TAG=interrupt-{name}-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true", PYTHONPATH=str(ROOT),
    )  # fmt: skip
    env[tag.split("=")[0]] = tag.split("=")[1]
    storage = tmp_path / "storage"
    cmd = [
        sys.executable, "-m", "flows.async_rl", "--config", "configs/tiny_cpu.yaml", "--trial", name,
        "train.steps=10000", "eval.every_n_versions=0", "eval.n_prompts=16", f"storage.root={storage}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 (outlives this function)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    latest = storage / "tiny-arith" / name / "checkpoints" / "LATEST"
    deadline = time.monotonic() + 600
    try:
        while not latest.exists():
            assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never published a checkpoint"
            time.sleep(1)
    except BaseException:
        _kill_tree(proc, tag)
        raise
    return proc, tag, tmp_path / f"{name}.log"


def _kill_tree(proc: subprocess.Popen[bytes], tag: str) -> None:
    """Clean up after a failed test: the run and whatever carries its tag."""
    proc.kill()
    proc.wait()
    for pid in _tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(tag: str, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def test_sigkill_of_the_flow_process_leaves_no_orphan(tmp_path: Path) -> None:
    proc, tag, _ = _start(tmp_path, "killed")
    try:
        # LATEST can name the initial weights before the rollout loop has started its reward workers:
        # wait until every kind of child is there.
        api_app = "prefect.server.api.server:create_app"
        kinds = (api_app, "cpu_server", "rollflow.rewards.worker")
        deadline = time.monotonic() + 300
        while True:
            children = _tagged(tag)
            children.pop(proc.pid, None)
            if all(any(k in c for c in children.values()) for k in kinds):
                break
            assert proc.poll() is None and time.monotonic() < deadline, children
            time.sleep(1)
        api = [c for c in children.values() if api_app in c]
        assert len(api) == 1, children  # the private API server, and no Prefect temporary server beside it
        proc.kill()
        proc.wait()
        assert not _wait_gone(tag, 60), "processes outlived a SIGKILL of the flow process"
    finally:
        _kill_tree(proc, tag)


def test_sigterm_stops_the_run_and_marks_it_killed(tmp_path: Path) -> None:
    proc, tag, log = _start(tmp_path, "stopped")
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_tree(proc, tag)
        pytest.fail("the run did not exit within 120 s of SIGTERM:\n" + log.read_text()[-3000:])
    assert rc != 0
    assert not _wait_gone(tag, 30), "processes outlived the stopped run"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-arith")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.`rollflow.trial` = 'stopped'")
    assert run.info.status == "KILLED", run.info.status
