"""Capacity credit in the rollout loop (real storage, fake 10-line client): groups the trainer will never
train (here: a quarantined shard) re-open the staleness capacity, in the running loop and after a restart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from test_loop import FakeClient, OneRowWorkflow, _cfg, _rows
from test_many_workers import _until

from rollflow.rollout.loop import run_rollout_loop
from storage import keys
from storage.fs import Storage
from storage.group_ledger import GroupLedger
from storage.shard_reader import ShardReader


def _loop(storage: Storage, stop: threading.Event, name: str = "w") -> Any:
    cfg = _cfg(max_staleness=0, claim_block_size=2)  # B = 4, flush every 2 groups, claim 2 prompts at once
    return asyncio.run(
        run_rollout_loop(
            cfg, storage, FakeClient(), prompts=_rows(50), workflow=OneRowWorkflow(), stop_event=stop,
            writer_name=name, poll_interval_s=0.02, done_poll_s=0.05,
        )
    )  # fmt: skip


def _quarantine_first_shard(storage: Storage) -> int:
    """Corrupt the oldest shard and let a trainer's reader find it; returns the groups it credits."""
    reader = ShardReader(storage)
    rec = reader.list_commits()[0]
    storage.put_bytes(rec.shard_key, b"not parquet")
    res = reader.take(100, min_head_version=0)
    assert res.quarantined == 1
    return int(storage.get_json(keys.quarantine_key(rec.commit_id))["credit"])


def test_quarantined_shard_reopens_capacity_with_max_staleness_0(storage: Storage) -> None:
    """B = 4, max_staleness = 0, servers at version 0: room = (0 + 0 + 1) * 4 - live.

    Prompt blocks of 2: block b may be claimed if (b + 1) * 2 - released - credited <= 4.

    1. The loop fills the room: blocks 0, 1 -> 4 groups, 2 shards of 2. Block 2: 6 - 0 > 4; it stalls.
    2. The "trainer" quarantines shard 1 (2 groups) and takes the other 2 (they are trained).
       credited 2 -> block 2: 6 - 2 = 4 <= 4: the running loop makes exactly 2 more (6 on disk);
       block 3: 8 - 2 = 6 > 4.
    3. Restart: the ledger restores accepted 6, credited 2 -> live 4 -> room 0: nothing more.
       Without the credit a restart would see live 6 and room -2.
    """
    stop = threading.Event()
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(s=_loop(storage, stop)))
    t.start()
    try:
        assert _until(lambda: GroupLedger(storage).refresh().accepted == 4)
        time.sleep(0.3)  # several capacity checks and syncs: no fifth group
        assert GroupLedger(storage).refresh().accepted == 4
        assert _quarantine_first_shard(storage) == 2
        assert _until(lambda: GroupLedger(storage).refresh().accepted == 6)
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(30)
    view = GroupLedger(storage).refresh()
    assert (view.accepted, view.credited) == (6, 2)
    assert out["s"].accepted == 6 and out["s"].total_accepted == 6

    stop2 = threading.Event()
    threading.Timer(0.5, stop2.set).start()
    again = _loop(storage, stop2)
    assert again.accepted == 0 and again.total_accepted == 6
    assert GroupLedger(storage).refresh().accepted == 6
