"""The two narrow windows of the rollout loop, each hit exactly by a real SIGKILL, then resumed and audited.

A helper process (``kill_point_child.py``) runs the real rollout loop with a fake inference client (the
trial of ``test_prompt_accounting``: 40 prompts, one epoch, blocks of 2) and SIGKILLs itself at the exact
point (``bench.kill_audit.install_kill_point``, a hook installed only in that process):

- right after a commit record is put, before the state put that follows it: the state file still lists
  the committed positions as open. Before the fix the resume adopted and ran them again: the audit
  counted them generated twice.
- right after a block claim, before ``on_claim``'s state put: the state file never names the block.
  Before the fix nobody ever ran it: the audit counted its positions unaccounted.

The resume runs in this process to the end of the epoch; then a trainer's records are written and
``bench.prompt_audit.audit_trial`` reads storage alone: every position committed once or dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_prompt_accounting import Client, _audit, _cfg, _roll, _train

from storage import keys
from storage.commits import CommitRecord
from storage.fs import Storage
from storage.prompt_claims import ClaimLog
from storage.worker_state import WorkerState

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("kill_point_child.py")


def _killed_at(tmp_path: Path, point: str, nth: int) -> Storage:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(CHILD.parent)])}
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), point, str(nth)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    return Storage.open(str(tmp_path), "exp", "t", {})


def _state(storage: Storage) -> dict:
    return storage.get_json(keys.rollout_state_key("rollout-w0"))


def _resume_and_audit(storage: Storage):  # noqa: ANN202 - an Audit
    cfg = _cfg(max_epochs=1)
    summary = _roll(storage, cfg, Client())
    assert summary.stopped_by == "epochs", summary
    _train(storage, steps=2)
    return _audit(storage, cfg)


def test_a_kill_right_after_a_commit_does_not_generate_its_groups_twice(tmp_path: Path) -> None:
    storage = _killed_at(tmp_path, "commit", 3)
    records = [CommitRecord.from_json(storage.get_json(k)) for k in storage.list(keys.COMMIT_DIR)]
    last = max(records, key=lambda r: r.created_at)
    state = _state(storage)
    assert state["updated_at"] < last.created_at  # the window: no state put after the last commit
    a = _resume_and_audit(storage)
    assert a.positions_handed_out == 40, a
    assert a.positions_generated_twice == 0 and a.groups_committed_twice == 0, a  # before the fix: 2
    assert a.positions_unaccounted == 0 and a.ok, a


def test_a_kill_right_after_a_claim_still_runs_the_block(tmp_path: Path) -> None:
    storage = _killed_at(tmp_path, "claim", 3)
    claimed = [k for k in storage.list("prompts/claims") if k.endswith(".json")]
    newest = max(int(k.rsplit("/", 1)[-1][:-5]) for k in claimed)
    assert str(newest) not in _state(storage)["blocks"]  # the window: the state never named the block
    a = _resume_and_audit(storage)
    assert a.positions_handed_out == 40, a
    assert a.positions_unaccounted == 0, a  # before the fix: the block's 2 positions, never run
    assert a.positions_generated_twice == 0 and a.ok, a


def test_a_dead_peers_claim_that_its_state_never_named_is_adopted(tmp_path: Path) -> None:
    """The same window in another worker: rollout-w1 claimed block 0 and died before its state put (its
    last state, an hour old, has claim_mark 0 and no blocks). After its lease, rollout-w0 finds the claim
    in the claim log and runs the block (before the fix: 2 positions unaccounted)."""
    storage = Storage.open(str(tmp_path), "exp", "t", {})
    assert ClaimLog(storage).try_claim(0, "rollout-w1-0badc0de", "rollout-w1")
    dead = {**WorkerState(writer="rollout-w1", incarnation="rollout-w1-0badc0de").to_json(), "claim_mark": 0}
    storage.put_json(keys.rollout_state_key("rollout-w1"), {**dead, "updated_at": time.time() - 3600})
    a = _resume_and_audit(storage)
    assert storage.exists(keys.takeover_key(0, 1))  # rollout-w0 adopted it
    assert a.positions_handed_out == 40 and a.positions_unaccounted == 0, a
    assert a.positions_generated_twice == 0 and a.ok, a
