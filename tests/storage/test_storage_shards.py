"""Shard writer/reader: commit protocol, exactly-once cursor, stale drops, quarantine (local + moto S3)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage_testlib import make_group, traj_ids

from storage import keys
from storage.commits import CommitRecord
from storage.errors import InvalidTrajectoryError
from storage.fs import Storage
from storage.schema import groups_to_table
from storage.shard_reader import ReaderCursor, ShardReader
from storage.shard_writer import ShardWriter

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _write(storage: Storage, n: int, *, flush_rows: int = 4, head=lambda i: i, name: str = "w") -> list[str]:
    """n groups of 2 rows; flush_rows=4 -> 2 groups per shard. Returns the traj ids in write order."""
    groups = [make_group(f"g{i}", head=head(i)) for i in range(n)]
    with ShardWriter(storage, name, flush_rows=flush_rows) as w:
        for g in groups:
            w.add(g)
    return traj_ids(groups)


def test_round_trip(storage: Storage) -> None:
    groups = [make_group(f"g{i}", head=i) for i in range(5)]
    w = ShardWriter(storage, "rollout-0", flush_rows=4)
    records = [w.add(g) for g in groups]
    # 2 rows per group, flush at 4 rows -> a commit after groups 1 and 3; group 4 waits for close()
    assert [r is not None for r in records] == [False, True, False, True, False]
    w.close()
    assert w.stats == {"rows": 10, "groups": 5, "shards": 3, "evicted": 0}
    reader = ShardReader(storage)
    res = reader.take(100)
    assert [g.group_id for g in res.groups] == [f"g{i}" for i in range(5)]
    got, want = res.groups[3].rows[1], groups[3].rows[1]
    assert (got.input_ids, got.versions, got.loss_mask, got.reward) == (
        want.input_ids,
        want.versions,
        want.loss_mask,
        want.reward,
    )
    assert got.writer == w.writer_id and res.dropped_stale == 0 and res.quarantined == 0
    assert len(res.commit_latency_s) == 3 and all(x >= 0 for x in res.commit_latency_s)
    assert reader.stats == {
        "groups_read": 5, "dropped_stale": 0, "duplicates": 0, "quarantined": 0, "commits_seen": 3,
        "refused_version": 0,
    }  # fmt: skip
    assert reader.take(100).groups == []
    recs = reader.list_commits(include_consumed=True)
    assert [(r.min_head_version, r.max_head_version, r.groups, r.rows) for r in recs] == [
        (0, 1, 2, 4),
        (2, 3, 2, 4),
        (4, 4, 1, 2),
    ]
    assert recs[0].key == keys.commit_key(0, w.writer_id, 0)
    assert reader.count_committed_groups() == 5


def test_flush_by_age_with_fake_clock(storage: Storage) -> None:
    now = [100.0]
    w = ShardWriter(storage, "w", flush_rows=1000, flush_seconds=5.0, clock=lambda: now[0])
    assert w.add(make_group("a")) is None
    now[0] += 4.9
    assert w.maybe_flush() is None
    now[0] += 0.2  # oldest group is 5.1 s old
    rec = w.maybe_flush()
    assert rec is not None and rec.groups == 1
    assert w.maybe_flush() is None  # empty buffer


def test_list_commits_reads_only_partitions_in_range(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(storage, 6, head=lambda i: (i // 2) * 2)  # shards with heads (0,0), (2,2), (4,4)
    listed: list[str] = []
    real_list = storage.list
    monkeypatch.setattr(storage, "list", lambda p: listed.append(p) or real_list(p))
    recs = ShardReader(storage).list_commits(min_version=1, max_version=3)
    assert [r.min_head_version for r in recs] == [2]
    assert listed == [keys.commit_partition(2)]


def test_two_writer_processes_at_once(storage_spec, tmp_path: Path) -> None:
    go = tmp_path / "go"
    spec = json.dumps(
        {
            "root": storage_spec.root,
            "experiment": storage_spec.experiment,
            "trial": storage_spec.trial,
            "options": storage_spec.options,
        }
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "storage_writer_proc.py"), spec, name, "10", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        for name in ("wa", "wb")
    ]
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-2000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert outs[0]["writer_id"] != outs[1]["writer_id"]
    assert [o["shards"] for o in outs] == [5, 5]  # 10 groups x 2 rows, flush at 4 rows
    res = ShardReader(storage_spec.open()).take(100)
    ids = traj_ids(res.groups)
    assert len(ids) == len(set(ids)) == 40
    for name in ("wa", "wb"):
        assert {g.group_id for g in res.groups if g.group_id.startswith(name)} == {
            f"{name}-g{i}" for i in range(10)
        }


def test_crash_between_shard_and_commit_is_invisible_then_retry_commits_once(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_put = storage.put_bytes

    def crash_on_commit(key: str, data: bytes, *, exclusive: bool = False) -> None:
        if key.startswith(keys.COMMIT_DIR):
            raise ConnectionError("simulated crash before the commit record")
        real_put(key, data, exclusive=exclusive)

    monkeypatch.setattr(storage, "put_bytes", crash_on_commit)
    w = ShardWriter(storage, "w", flush_rows=100)
    w.add(make_group("a"))
    with pytest.raises(ConnectionError):
        w.flush()
    assert len(storage.list(keys.SHARD_DIR)) == 1  # the shard is there...
    assert ShardReader(storage).take(10).groups == []  # ...but without a record it does not exist
    assert ShardReader(storage).count_committed_groups() == 0

    monkeypatch.setattr(storage, "put_bytes", real_put)
    rec = w.flush()  # the pending shard is retried with the same keys
    assert rec is not None and w.stats["shards"] == 1
    assert len(storage.list(keys.SHARD_DIR)) == 1  # same shard key, not a second copy
    assert [g.group_id for g in ShardReader(storage).take(10).groups] == ["a"]


def test_retry_after_lost_commit_response_is_idempotent(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_put = storage.put_bytes
    lost = {"n": 0}

    def put_then_lose_response(key: str, data: bytes, *, exclusive: bool = False) -> None:
        real_put(key, data, exclusive=exclusive)
        if key.startswith(keys.COMMIT_DIR) and lost["n"] == 0:
            lost["n"] += 1
            raise TimeoutError("response lost after the put landed")

    monkeypatch.setattr(storage, "put_bytes", put_then_lose_response)
    w = ShardWriter(storage, "w", flush_rows=100)
    w.add(make_group("a"))
    with pytest.raises(TimeoutError):
        w.flush()
    rec = w.flush()  # exclusive put conflicts with an identical record -> success
    assert rec is not None and w.stats == {"rows": 2, "groups": 1, "shards": 1, "evicted": 0}
    assert [g.group_id for g in ShardReader(storage).take(10).groups] == ["a"]


def test_invalid_group_is_evicted_not_blocking(storage: Storage) -> None:
    evicted: list[int] = []
    w = ShardWriter(storage, "w", flush_rows=100, on_evict=evicted.append)
    bad = make_group("bad")
    bad.rows[0].head_version = 42  # inconsistent with versions
    w.add(make_group("ok1"))
    w.add(bad)
    with pytest.raises(InvalidTrajectoryError, match="bad"):
        w.flush()
    w.add(make_group("ok2"))
    w.close()
    assert [g.group_id for g in ShardReader(storage).take(10).groups] == ["ok1", "ok2"]
    assert evicted == [1] and w.stats["evicted"] == 1  # reported, so the rollout credits it back


def test_stale_groups_are_consumed_and_dropped(storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(storage, 6)  # heads 0..5; shards (0,1) (2,3) (4,5)
    fetched: list[str] = []
    real_get = storage.get_bytes
    monkeypatch.setattr(storage, "get_bytes", lambda k: fetched.append(k) or real_get(k))
    reader = ShardReader(storage)
    res = reader.take(2, min_head_version=3)
    # shard (0,1): max head 1 < 3 -> 2 dropped without download; shard (2,3): g2 dropped, g3 kept; g4 kept
    assert [g.group_id for g in res.groups] == ["g3", "g4"]
    assert res.dropped_stale == 3 and reader.stats["dropped_stale"] == 3
    assert not any(k.endswith("-00000000.parquet") for k in fetched)
    assert [g.group_id for g in reader.take(10, min_head_version=3).groups] == ["g5"]


def test_cursor_save_restore_exactly_once(storage_spec) -> None:
    storage = storage_spec.open()
    written = _write(storage, 7)  # shards: (g0,g1) (g2,g3) (g4,g5) (g6)
    r1 = ShardReader(storage)
    first = r1.take(3)  # g0, g1, g2: stops inside the second shard
    saved = json.loads(json.dumps(r1.cursor.to_json()))
    assert saved["partial"] and list(saved["partial"].values()) == [1]

    more = ShardWriter(storage, "late", flush_rows=100)  # new data after the save
    more.add(make_group("g7"))
    more.close()

    r2 = ShardReader(storage_spec.open(), ReaderCursor.from_json(saved))  # a "restarted" reader
    rest = r2.take(100)
    assert [g.group_id for g in first.groups] == ["g0", "g1", "g2"]
    assert [g.group_id for g in rest.groups] == ["g3", "g4", "g5", "g6", "g7"]
    ids = traj_ids(first.groups) + traj_ids(rest.groups)
    assert len(ids) == len(set(ids)) and set(ids) == set(written) | {"g7-r0", "g7-r1"}
    # and the original reader, continuing without a restore, agrees on what comes next
    assert [g.group_id for g in r1.take(2).groups] == ["g3", "g4"]
    assert ReaderCursor.from_json(r2.cursor.to_json()) == r2.cursor


def test_take_is_all_or_nothing_on_transient_errors(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(storage, 4)
    real_get = storage.get_bytes

    def flaky(key: str) -> bytes:
        if key.endswith("-00000001.parquet"):
            raise ConnectionError("transient")
        return real_get(key)

    monkeypatch.setattr(storage, "get_bytes", flaky)
    reader = ShardReader(storage)
    before = reader.cursor.to_json()
    with pytest.raises(ConnectionError):
        reader.take(4)
    assert reader.cursor.to_json() == before and reader.stats["groups_read"] == 0
    monkeypatch.setattr(storage, "get_bytes", real_get)
    assert [g.group_id for g in reader.take(4).groups] == ["g0", "g1", "g2", "g3"]


def _corrupt(storage: Storage, rec: CommitRecord, kind: str) -> None:
    data = storage.get_bytes(rec.shard_key)
    if kind == "truncated":
        storage.put_bytes(rec.shard_key, data[: len(data) // 2])
    elif kind == "sha256":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        storage.put_bytes(rec.shard_key, bytes(flipped))
    elif kind == "schema":
        # A "foreign" writer: correct record (sha256, size) for a shard of another schema.
        table = groups_to_table([make_group("x1"), make_group("x2")]).drop_columns(["logprobs"])
        sink = io.BytesIO()
        pq.write_table(table, sink)
        blob = sink.getvalue()
        storage.put_bytes(rec.shard_key, blob)
        fixed = {**rec.to_json(), "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
        storage.delete(rec.key)
        storage.put_json(rec.key, fixed)
    elif kind == "record":
        storage.delete(rec.key)
        storage.put_bytes(rec.key, b"{not json")
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated", "sha256", "schema", "record"])
def test_bad_shard_is_quarantined_and_reader_keeps_going(
    storage: Storage, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    _write(storage, 6)  # three shards: (g0,g1) (g2,g3) (g4,g5)
    reader = ShardReader(storage)
    recs = reader.list_commits()
    bad = recs[1]
    _corrupt(storage, bad, kind)
    reader = ShardReader(storage)  # fresh reader: no cached record
    with caplog.at_level(logging.ERROR, logger="storage"):
        res = reader.take(10)
    assert [g.group_id for g in res.groups] == ["g0", "g1", "g4", "g5"]
    assert res.quarantined == 1 and reader.stats["quarantined"] == 1
    assert any("quarantined commit" in r.message and bad.commit_id in r.message for r in caplog.records)
    q = storage.get_json(keys.quarantine_key(bad.commit_id))
    assert q["commit_id"] == bad.commit_id and q["reason"]
    assert storage.exists(bad.shard_key)  # data left in place for a human
    assert reader.take(10).groups == [] and reader.stats["quarantined"] == 1  # not re-quarantined
    # a restarted reader with the saved cursor neither returns nor re-quarantines it
    r2 = ShardReader(storage, ReaderCursor.from_json(reader.cursor.to_json()))
    assert r2.take(10).groups == [] and r2.stats["quarantined"] == 0


def test_foreign_schema_version_in_record(storage: Storage) -> None:
    _write(storage, 2)
    rec = ShardReader(storage).list_commits()[0]
    storage.delete(rec.key)
    storage.put_json(rec.key, {**rec.to_json(), "schema_version": 99})
    res = ShardReader(storage).take(10)
    assert res.groups == [] and res.quarantined == 1
    assert "schema_version 99" in storage.get_json(keys.quarantine_key(rec.commit_id))["reason"]


def test_reader_rejects_unknown_cursor_format() -> None:
    with pytest.raises(ValueError):
        ReaderCursor.from_json({"format": 99})
    c = ReaderCursor()
    c.advance("w-abc-00000001", 1, 3)
    c.advance("w-abc-00000000", 2, 2)
    c.finish("w-abc-00000002")
    doc = c.to_json()
    assert doc["done"] == {"w-abc": [[0, 0], [2, 2]]} and doc["partial"] == {"w-abc-00000001": 1}
    assert ReaderCursor.from_json(doc) == c


def test_table_schema_of_written_shard(storage: Storage) -> None:
    _write(storage, 2)
    rec = ShardReader(storage).list_commits()[0]
    table = pq.read_table(pa.BufferReader(storage.get_bytes(rec.shard_key)))
    assert table.schema.metadata[b"rollflow.schema_version"] == b"1"
    assert table.num_rows == rec.rows == 4


def _two_writers_same_ids(storage: Storage, ids: list[str], *, head: int = 0) -> None:
    for name in ("w1", "w2"):  # two writers whose valid shards carry the same group ids
        with ShardWriter(storage, name, flush_rows=100) as w:
            for gid in ids:
                w.add(make_group(gid, head=head))


def test_a_group_id_is_delivered_once_across_commits(storage: Storage, caplog) -> None:  # noqa: ANN001
    from storage import credits
    from storage.group_ledger import GroupLedger

    _two_writers_same_ids(storage, ["a", "b", "c"])
    reader = ShardReader(storage)
    with caplog.at_level(logging.ERROR, logger="storage.shard_reader"):
        res = reader.take(100)
    assert sorted(g.group_id for g in res.groups) == ["a", "b", "c"]  # 3 deliveries, not 6
    assert res.duplicates == 3 and reader.stats["duplicates"] == 3
    first, second = sorted({c.commit_id for c in reader.list_commits(include_consumed=True)})
    dup_lines = [r.getMessage() for r in caplog.records if "already delivered" in r.getMessage()]
    assert len(dup_lines) == 3 and all(first in m and second in m for m in dup_lines), dup_lines
    # the duplicates are credited like stale groups: they hold no staleness capacity
    credited = [storage.get_json(k) for k in storage.list(credits.CREDIT_DIR) if k.endswith(".json")]
    assert sum(len(d["dropped"]) for d in credited) == 3
    view = GroupLedger(storage).refresh()
    assert (view.accepted, view.credited) == (6, 3)  # the staleness counters see 3 groups, once each


def test_a_group_id_is_delivered_once_across_a_restart(storage_spec) -> None:
    storage = storage_spec.open()
    with ShardWriter(storage, "w1", flush_rows=100) as w:
        for gid in ("a", "b"):
            w.add(make_group(gid, head=3))
    r1 = ShardReader(storage)
    assert [g.group_id for g in r1.take(10, min_head_version=2).groups] == ["a", "b"]
    saved = json.loads(json.dumps(r1.cursor.to_json()))
    with ShardWriter(storage, "w2", flush_rows=100) as w:  # committed after the save: the same ids
        for gid in ("b", "a", "z"):
            w.add(make_group(gid, head=3))
    r2 = ShardReader(storage_spec.open(), ReaderCursor.from_json(saved))  # a restarted trainer
    res = r2.take(10, min_head_version=2)
    assert [g.group_id for g in res.groups] == ["z"] and res.duplicates == 2


def test_remembered_ids_are_bounded_by_the_staleness_window(storage: Storage) -> None:
    with ShardWriter(storage, "w1", flush_rows=2) as w:
        for i in range(6):
            w.add(make_group(f"g{i}", head=i))
    reader = ShardReader(storage)
    assert len(reader.take(100, min_head_version=0).groups) == 6
    assert len(reader.cursor.to_json()["delivered"]) == 6
    reader.take(100, min_head_version=4)  # ids of heads 0..3 can only come back stale: forgotten
    assert [e[0] for e in reader.cursor.to_json()["delivered"]] == ["g4", "g5"]
