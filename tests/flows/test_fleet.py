"""A fleet that heals itself: the embedded async-rl run and ``kill -9`` of its only inference server.

The flow runs on a real Prefect server with one real CPU inference server (infra/cpu_server). Once the
trainer has published v3, the test SIGKILLs the server process.

1. With restarts allowed, the supervisor restarts it on the same port, the watcher loads the served
   version into it, the rollout goes on and the run completes: every step trained, the done marker
   written, one restart counted, and checkpoint GC still within bounds.
2. With ``inference.max_restarts=0`` the server is lost: the flow fails at once (not after
   ``train.data_wait_timeout_s``) with a ``LoopFailedError`` naming ``rollout-loop`` and the lost server,
   and the trainer has stopped and written its resume point; no done marker.
"""

from __future__ import annotations

import contextvars
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # whole runs on a shared 2-core machine

ROOT = Path(__file__).resolve().parents[2]
STEPS = 14


def _child_cpu_servers(model: Path) -> list[int]:
    """Pids of CPU inference servers that are children of this test process and serve ``model`` (other
    tests' session-scoped servers, e.g. tests/agents', are children of this process too)."""
    me = str(os.getpid())
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = stat.rsplit(")", 1)[1].split()[1]
        if ppid == me and b"infra.cpu_server" in cmdline and str(model).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _overrides(tmp_path: Path, trial: str) -> list[str]:
    return [
        f"trial={trial}",
        f"storage.root={tmp_path / 'storage'}",
        f"storage.local_cache={tmp_path / 'cache'}",
        f"model.path={tmp_path / 'model'}",
        "model.tiny.warm_start_steps=20",
        "tracking.enabled=false",
        f"train.steps={STEPS}",
        "storage.keep_checkpoints=2",
        "eval.every_n_versions=0",
        "eval.n_prompts=16",
        "inference.n_servers=1",
        "train.data_wait_timeout_s=300",
    ]


def _run_and_kill_the_server(root: Path, trial: str, overrides: list[str]) -> dict[str, Any]:
    """Start the flow in a thread, SIGKILL its CPU server once v3 is out, return how the flow ended."""
    from flows.async_rl import async_rl
    from storage import keys

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides)
        except BaseException as e:  # reported below
            result["error"] = e

    ctx = contextvars.copy_context()  # the Prefect settings of use_prefect_server live in a context var
    t = threading.Thread(target=ctx.run, args=(run,), daemon=True)
    t.start()
    latest = root / "tiny-arith" / trial / keys.LATEST_KEY
    deadline = time.monotonic() + 600
    while True:
        assert t.is_alive(), f"the run ended before v3: {result}"
        assert time.monotonic() < deadline, "no v3 within 600 s"
        try:
            if json.loads(latest.read_text())["version"] >= 3:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    pids = _child_cpu_servers(root.parent / "model")  # model.path of _overrides
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)

    t.join(900)
    assert not t.is_alive(), "the run did not finish after the server was killed"
    return result


def test_kill_9_the_inference_server_mid_run_and_the_run_completes(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import keys
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    root = tmp_path / "storage"
    result = _run_and_kill_the_server(root, "fleet-kill", _overrides(tmp_path, "fleet-kill"))
    assert "error" not in result, repr(result.get("error"))
    summary = result["summary"]
    assert summary["final_version"] == STEPS
    assert summary["rollout"]["server_restarts"] == 1 and summary["rollout"]["servers_lost"] == 0
    storage = Storage.open(str(root), "tiny-arith", "fleet-kill")
    assert storage.get_json(keys.TRAINER_DONE_KEY)["version"] == STEPS
    # GC kept going across the restart (same address, same ack id): only a few versions remain.
    committed = [k for k in storage.list(keys.CHECKPOINT_DIR) if k.endswith("/COMMIT.json")]
    assert len(committed) <= 4, committed
    assert not _child_cpu_servers(tmp_path / "model")  # the restarted server was stopped with the run


def test_a_lost_server_fails_the_run_naming_the_rollout_loop_and_the_trainer_saves(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollflow.api.errors import LoopFailedError
    from rollflow.training.resume import list_resume_steps
    from storage import keys
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    root = tmp_path / "storage"
    overrides = [*_overrides(tmp_path, "fleet-lost"), "inference.max_restarts=0", "train.resume_every=1000"]
    result = _run_and_kill_the_server(root, "fleet-lost", overrides)
    err = result.get("error")
    assert isinstance(err, LoopFailedError), repr(err)
    assert err.loop == "rollout-loop" and str(err).startswith("rollout-loop failed: ")
    assert "ServerLostError" in str(err) and "giving up on inference server 127.0.0.1:" in str(err), str(err)
    assert "exited with code -9" in str(err)
    assert "the trainer stopped at version" in str(err) and "wrote its resume point" in str(err)
    storage = Storage.open(str(root), "tiny-arith", "fleet-lost")
    stopped_at = int(str(err).split("the trainer stopped at version ")[1].split()[0])
    assert stopped_at >= 3 and list_resume_steps(storage) == [
        stopped_at
    ]  # resume_every=1000: written at stop
    assert not storage.exists(keys.TRAINER_DONE_KEY)
    assert not _child_cpu_servers(tmp_path / "model")
