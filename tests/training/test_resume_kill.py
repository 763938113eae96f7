"""Exact resume: SIGKILL the trainer process at different moments, restart it, audit what it consumed.

The trainer runs as ``python -m rollflow.training.run`` against a local trial that this test feeds with
shards in phases, so each kill lands at a known point:

1. during startup (imports / model load), before anything is written;
2. while it waits for data after step 3 (last resume point: step 2, so step 3 is replayed);
3. right after resume point 6 is committed (it may be inside step 7 already);
4. a few tens of milliseconds after step 9's consumed log appears (anywhere in steps 9-12).

The final run finishes. Then: every written group was trained on exactly once over steps 1..12, steps
saw groups oldest first, versions were published in order and never twice, and DONE.json is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import write_groups

from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.keys import consumed_key

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STEPS, BATCH = 12, 2
GIDS = [f"g{i:02d}" for i in range(STEPS * BATCH)]


def _start(cfg_path: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rollflow.training.run", "--config", str(cfg_path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(cond, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early with {proc.returncode}")
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()  # SIGKILL: no cleanup, no resume point at exit
    proc.wait(timeout=10)


def test_sigkill_at_four_moments_then_finish(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = str(tmp_path / "store")
    storage = Storage.open(root, "kill", "t0")
    cfg = {
        "experiment": "kill",
        "trial": "t0",
        "storage": {"root": root},
        "model": {"path": str(tiny_model_dir)},
        "rollout": {"max_staleness": 1000, "group_size": 4},
        "train": {
            "steps": STEPS,
            "batch_size": BATCH,
            "lr": 1e-3,
            "resume_every": 2,
            "checkpoint_every": 1,
            "max_tokens_per_mb": 64,
            "data_wait_timeout_s": 120.0,
            "threads": 1,
        },
    }
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "trainer.log"
    exists = storage.exists

    # 1. killed during startup: nothing published yet
    proc = _start(cfg_path, log)
    time.sleep(1.0)
    _kill(proc)

    # 2. killed while waiting for data after step 3 (resume point at 2)
    write_groups(storage, GIDS[:6], per_shard=2)
    proc = _start(cfg_path, log)
    _wait_for(lambda: exists(consumed_key(3)), proc)
    time.sleep(0.3)  # it is now polling for step 4's data
    _kill(proc)
    assert CheckpointStore(storage).resolve_latest().version == 3  # type: ignore[union-attr]

    # 3. killed right after resume point 6 is committed
    write_groups(storage, GIDS[6:14], per_shard=3)
    proc = _start(cfg_path, log)
    _wait_for(lambda: exists(keys.trainer_state_key(6)), proc)
    _kill(proc)

    # 4. killed somewhere in steps 9..12
    write_groups(storage, GIDS[14:], per_shard=4)
    proc = _start(cfg_path, log)
    _wait_for(lambda: exists(consumed_key(9)), proc)
    time.sleep(0.03)
    _kill(proc)

    # 5. runs to the end
    proc = _start(cfg_path, log)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]

    steps = [storage.get_json(consumed_key(s))["groups"] for s in range(1, STEPS + 1)]
    flat = [g for s in steps for g in s]
    assert sorted(flat) == GIDS and len(set(flat)) == len(flat)  # every group exactly once
    assert flat == GIDS  # and oldest first
    assert storage.list("trainer/consumed") == [consumed_key(s) for s in range(1, STEPS + 1)]

    store = CheckpointStore(storage)
    done = store.is_done()
    assert done is not None and done["version"] == STEPS and done["groups_consumed"] == len(GIDS)
    assert store.resolve_latest().version == STEPS  # type: ignore[union-attr]
    committed = store.list_committed()
    created = [storage.get_json(keys.checkpoint_commit_key(v))["created_at"] for v in committed]
    assert committed == sorted(committed) and created == sorted(created)  # published in version order
    text = log.read_text()
    assert text.count("resumed from resume point") >= 3
    assert "not publishing v3" in text  # the replayed step 3 was not re-published


def test_sigterm_stops_gracefully_with_a_resume_point(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = str(tmp_path / "store")
    storage = Storage.open(root, "term", "t0")
    write_groups(storage, GIDS[:4], per_shard=2)
    cfg = {
        "experiment": "term",
        "trial": "t0",
        "storage": {"root": root},
        "model": {"path": str(tiny_model_dir)},
        "rollout": {"max_staleness": 1000},
        "train": {"steps": STEPS, "batch_size": BATCH, "resume_every": 10, "data_wait_timeout_s": 120.0},
    }
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "trainer.log"
    proc = _start(cfg_path, log)
    _wait_for(lambda: storage.exists(consumed_key(2)), proc)
    time.sleep(0.2)  # waiting for step 3's data now
    proc.terminate()  # SIGTERM
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["stopped"] and not summary["done"] and summary["final_version"] == 2
    assert storage.exists(keys.trainer_state_key(2))  # resume_every=10, but a stop always leaves one
    assert CheckpointStore(storage).is_done() is None
