"""Capacity credits in storage: the trainer's reader records stale drops and quarantines, and the
`GroupLedger` sums them (local + moto S3), with counts worked by hand in the comments."""

from __future__ import annotations

import json

from storage_testlib import make_group

from storage import credits, keys
from storage.fs import Storage
from storage.group_ledger import GroupLedger
from storage.shard_reader import ReaderCursor, ShardReader
from storage.shard_writer import ShardWriter


def _write(storage: Storage, heads: list[int], *, per_shard: int = 2, name: str = "w") -> str:
    """Groups g0.. with the given heads, `per_shard` groups (2 rows each) per shard; returns the writer id."""
    with ShardWriter(storage, name, flush_rows=2 * per_shard) as w:
        for i, h in enumerate(heads):
            w.add(make_group(f"{name}{i}", head=h))
    return w.writer_id


def test_stale_drops_are_credited_once_the_commit_is_consumed(storage: Storage) -> None:
    wid = _write(storage, [0, 0, 1, 3, 4, 4])  # shards (0,0) (1,3) (4,4)
    reader = ShardReader(storage)
    res = reader.take(3, min_head_version=2)
    # shard 1: max head 0 < 2 -> both dropped from the record; shard 2: head 1 dropped, head 3 kept;
    # shard 3: both kept -> 3 returned, 3 dropped
    assert [g.head_version for g in res.groups] == [3, 4, 4] and res.dropped_stale == 3
    docs = {k: storage.get_json(k) for k in storage.list(credits.CREDIT_DIR)}
    assert docs == {
        credits.credit_key(0, f"{wid}-00000000"): {"commit_id": f"{wid}-00000000", "dropped": [0, 1]},
        credits.credit_key(1, f"{wid}-00000001"): {"commit_id": f"{wid}-00000001", "dropped": [0]},
    }
    view = GroupLedger(storage).refresh()
    # 6 accepted, 2 + 1 = 3 credited: 3 groups may still be trained (the three returned)
    assert (view.accepted, view.credited, view.by_writer) == (6, 3, {wid: 6})


def test_partial_drops_survive_a_reader_restart_and_are_credited_when_the_commit_ends(
    storage_spec,
) -> None:
    storage = storage_spec.open()
    wid = _write(storage, [0, 5, 0, 5], per_shard=4)  # one shard of 4 groups: heads 0 5 0 5
    r1 = ShardReader(storage)
    first = r1.take(1, min_head_version=2)  # drops index 0, returns index 1; commit stays partial
    assert [g.group_id for g in first.groups] == ["w1"] and first.dropped_stale == 1
    assert storage.list(credits.CREDIT_DIR) == []  # nothing credited while the commit is partial
    saved = json.loads(json.dumps(r1.cursor.to_json()))
    assert saved["partial_dropped"] == {f"{wid}-00000000": [0]}

    r2 = ShardReader(storage_spec.open(), ReaderCursor.from_json(saved))  # the trainer restarted
    rest = r2.take(5, min_head_version=2)  # drops index 2, returns index 3
    assert [g.group_id for g in rest.groups] == ["w3"] and rest.dropped_stale == 1
    doc = storage.get_json(credits.credit_key(0, f"{wid}-00000000"))
    assert doc["dropped"] == [0, 2]  # the drop made before the restart is not lost
    view = GroupLedger(storage).refresh()
    assert (view.accepted, view.credited) == (4, 2)  # 4 - 2 = the 2 groups trained


def test_a_quarantined_shard_credits_its_unconsumed_groups(storage: Storage) -> None:
    _write(storage, [0, 0, 0, 0])  # shards A=(0,0), B=(0,0)
    reader = ShardReader(storage)
    bad = reader.list_commits()[1]
    storage.put_bytes(bad.shard_key, b"garbage")
    res = reader.take(10)
    assert len(res.groups) == 2 and res.quarantined == 1
    q = storage.get_json(keys.quarantine_key(bad.commit_id))
    assert q["credit"] == 2
    # max_staleness 0, B = 2: before the credit the live count was 4 and a trainer at version 1 (2 groups
    # trained) left room (0 + 1 + 1) * 2 - 4 = 0; with 2 credited it is 4 - 2 = 2 live -> room 2
    view = GroupLedger(storage).refresh()
    assert (view.accepted, view.credited) == (4, 2)
    assert credits.quarantine_credit({"record": {"groups": 3}}) == 3  # documents of older readers
    assert credits.quarantine_credit({"record": None}) == 0  # an unreadable record counts nowhere


def test_ledger_counts_every_writer_and_reads_each_record_once(storage: Storage) -> None:
    a = _write(storage, [0, 0, 1], name="a")  # shards (0,0) (1)
    b = _write(storage, [0, 1], name="b", per_shard=1)  # shards (0) (1)
    ledger = GroupLedger(storage)
    view = ledger.refresh()
    assert view.by_writer == {a: 3, b: 2} and view.accepted == 5 and view.credited == 0
    got: list[str] = []
    real = storage.get_bytes
    storage.get_bytes = lambda k: got.append(k) or real(k)  # type: ignore[method-assign]
    c = _write(storage, [2], name="a")  # a restarted worker "a": a new incarnation, new keys
    assert c != a
    view = ledger.refresh()
    assert view.by_writer == {a: 3, b: 2, c: 1}
    assert [k for k in got if k.startswith(keys.COMMIT_DIR)] == [keys.commit_key(2, c, 0)]
