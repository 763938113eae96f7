"""A fleet that heals itself: the embedded async-rl run survives ``kill -9`` of its only inference server.

The flow runs on a real Prefect server with one real CPU inference server (infra/cpu_server). Once the
trainer has published v3, the test SIGKILLs the server process. The supervisor restarts it on the same
port, the watcher loads the served version into it, the rollout goes on and the run completes: every
step trained, the done marker written, one restart counted, and checkpoint GC still within bounds.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = 14


def _child_cpu_servers() -> list[int]:
    """Pids of CPU inference servers that are children of this test process."""
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
        if ppid == me and b"infra.cpu_server" in cmdline:
            pids.append(int(proc.name))
    return pids


def test_kill_9_the_inference_server_mid_run_and_the_run_completes(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.async_rl import async_rl
    from storage import keys
    from storage.fs import Storage

    monkeypatch.chdir(ROOT)
    root = tmp_path / "storage"
    overrides = [
        "trial=fleet-kill",
        f"storage.root={root}",
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
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = async_rl(config="configs/tiny_cpu.yaml", overrides=overrides)
        except BaseException as e:  # reported below
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    latest = root / "tiny-arith" / "fleet-kill" / keys.LATEST_KEY
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
    pids = _child_cpu_servers()
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)

    t.join(900)
    assert not t.is_alive(), "the run did not finish after the server was killed"
    assert "error" not in result, repr(result.get("error"))
    summary = result["summary"]
    assert summary["final_version"] == STEPS
    assert summary["rollout"]["server_restarts"] == 1 and summary["rollout"]["servers_lost"] == 0
    storage = Storage.open(str(root), "tiny-arith", "fleet-kill")
    assert storage.get_json(keys.TRAINER_DONE_KEY)["version"] == STEPS
    # GC kept going across the restart (same address, same ack id): only a few versions remain.
    committed = [k for k in storage.list(keys.CHECKPOINT_DIR) if k.endswith("/COMMIT.json")]
    assert len(committed) <= 4, committed
    assert not _child_cpu_servers()  # the restarted server was stopped with the run
