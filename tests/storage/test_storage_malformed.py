"""Malformed trajectory data and commit records: refused on write, quarantined on read, never a crash.

Each case names what a hostile or broken producer could put in storage and checks the named error (on
write) or the quarantine record naming the file (on read), and that good data around it still flows
exactly once (local dir and moto S3).
"""

from __future__ import annotations

import hashlib
import io
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage_testlib import make_group

from storage import keys
from storage.commits import CommitRecord
from storage.errors import InvalidTrajectoryError, NonFiniteValueError, SchemaMismatchError
from storage.fs import Storage
from storage.schema import groups_to_table
from storage.shard_reader import ReaderCursor, ShardReader
from storage.shard_writer import ShardWriter


def _write(storage: Storage, n: int) -> list[CommitRecord]:
    """n groups of 2 rows, 2 groups per shard; returns the records oldest first."""
    with ShardWriter(storage, "w", flush_rows=4) as w:
        for i in range(n):
            w.add(make_group(f"g{i}", head=i))
    return ShardReader(storage).list_commits()


def _replace_shard(storage: Storage, rec: CommitRecord, table: pa.Table) -> None:
    """Put `table` as the shard of `rec`, with a record whose size and sha256 match (a 'valid' commit)."""
    sink = io.BytesIO()
    pq.write_table(table, sink)
    blob = sink.getvalue()
    storage.put_bytes(rec.shard_key, blob)
    storage.delete(rec.key)
    storage.put_json(
        rec.key, {**rec.to_json(), "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    )


def _ids(groups: list) -> list[str]:
    return [g.group_id for g in groups]


# --- write side --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reward", [1e39, 1e308, -1e39, math.inf, math.nan])
def test_reward_not_finite_in_float32_is_refused_on_write(storage: Storage, reward: float) -> None:
    bad = make_group("bad")
    bad.rows[1].reward = reward
    with pytest.raises(NonFiniteValueError, match="reward") as err:
        groups_to_table([make_group("ok"), bad])
    assert "bad-r1" in str(err.value) and "float32" in str(err.value)
    w = ShardWriter(storage, "w", flush_rows=100)
    w.add(make_group("ok"))
    w.add(bad)
    with pytest.raises(InvalidTrajectoryError, match="'bad'.*reward"):
        w.flush()
    w.close()  # the good group was kept and commits
    assert _ids(ShardReader(storage).take(10).groups) == ["ok"]


@pytest.mark.parametrize("position", [0, 5])  # 0: a masked prompt token; 5: a trained token
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1e39])
def test_non_finite_logprob_is_refused_on_write(position: int, value: float) -> None:
    bad = make_group("bad")
    bad.rows[0].logprobs[position] = value
    with pytest.raises(NonFiniteValueError, match="logprobs") as err:
        groups_to_table([bad])
    assert f"'bad-r0'), token {position}" in str(err.value)


def test_negative_token_id_is_refused_on_write() -> None:
    bad = make_group("bad")
    bad.rows[0].input_ids[2] = -5
    with pytest.raises(SchemaMismatchError, match="token 2: negative token id -5"):
        groups_to_table([bad])


# --- read side: shards -------------------------------------------------------------------------------------


def test_shard_with_inf_reward_is_quarantined_on_read(storage: Storage) -> None:
    recs = _write(storage, 4)
    table = groups_to_table([make_group("g2", head=2), make_group("g3", head=3)])
    rewards = pa.array([1.0, math.inf, 0.0, 1.0], type=pa.float32())
    _replace_shard(
        storage, recs[1], table.set_column(table.schema.get_field_index("reward"), "reward", rewards)
    )
    reader = ShardReader(storage)
    res = reader.take(10)
    assert _ids(res.groups) == ["g0", "g1"] and res.quarantined == 1
    assert "reward" in storage.get_json(keys.quarantine_key(recs[1].commit_id))["reason"]


def test_token_id_outside_vocabulary_quarantines_the_shard_also_after_restart(storage: Storage) -> None:
    recs = _write(storage, 6)
    g2, g3 = make_group("g2", head=2), make_group("g3", head=3)
    g3.rows[1].input_ids[4] = 2**30  # schema-valid int32, far outside any vocabulary
    _replace_shard(storage, recs[1], groups_to_table([g2, g3]))
    reader = ShardReader(storage, vocab_size=1000)
    res = reader.take(10)
    assert _ids(res.groups) == ["g0", "g1", "g4", "g5"] and res.quarantined == 1
    reason = storage.get_json(keys.quarantine_key(recs[1].commit_id))["reason"]
    assert "token id 1073741824" in reason and "[0, 1000)" in reason and "'g3-r1'" in reason
    # a restart from the saved cursor does not meet it again...
    r2 = ShardReader(storage, ReaderCursor.from_json(reader.cursor.to_json()), vocab_size=1000)
    assert r2.take(10).groups == [] and r2.stats["quarantined"] == 0
    # ...and a restart from before the quarantine (cursor lost) quarantines it again instead of crashing
    r3 = ShardReader(storage, vocab_size=1000)
    assert _ids(r3.take(10).groups) == ["g0", "g1", "g4", "g5"] and r3.stats["quarantined"] == 1
    # without a vocabulary the reader cannot know: ids pass (the trainer always passes its vocab size)
    assert len(ShardReader(storage).take(10).groups) == 6


def test_shard_key_that_is_a_directory_is_quarantined(storage: Storage) -> None:
    recs = _write(storage, 4)
    data = storage.get_bytes(recs[0].shard_key)
    storage.delete(recs[0].shard_key)
    storage.put_bytes(recs[0].shard_key + "/inside.parquet", data)  # the key is now a directory
    reader = ShardReader(storage)
    res = reader.take(10)  # returns instead of raising on every poll
    assert _ids(res.groups) == ["g2", "g3"] and res.quarantined == 1
    assert recs[0].shard_key in storage.get_json(keys.quarantine_key(recs[0].commit_id))["reason"]


# --- read side: commit records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 200_000 + b"]" * 200_000,  # RecursionError in json.loads
        b'{"a":' * 200_000 + b"1" + b"}" * 200_000,
        b"\xff\xfe not utf-8",
        b"Infinity",
        b"",
        b'{"commit_id": 1}',
    ],
    ids=["deep-list", "deep-object", "bad-utf8", "infinity", "empty", "wrong-fields"],
)
def test_unparseable_commit_record_is_quarantined_naming_the_file(storage: Storage, raw: bytes) -> None:
    recs = _write(storage, 4)
    storage.delete(recs[0].key)
    storage.put_bytes(recs[0].key, raw)
    reader = ShardReader(storage)
    res = reader.take(10)
    assert _ids(res.groups) == ["g2", "g3"] and res.quarantined == 1
    q = storage.get_json(keys.quarantine_key(recs[0].commit_id))
    assert recs[0].key in q["reason"] and q["record_key"] == recs[0].key


def test_second_record_for_a_committed_shard_is_refused(storage: Storage) -> None:
    recs = _write(storage, 4)
    # A record under a new (writer, seq), itself consistent, that names g0/g1's shard again.
    orig = recs[0]
    dup = {
        **orig.to_json(),
        "writer": "evil-00000000",
        "seq": 7,
        "commit_id": keys.commit_id("evil-00000000", 7),
    }
    dup["key"] = keys.commit_key(orig.partition, "evil-00000000", 7)
    dup["created_at"] = orig.created_at + 1000  # newest: would be read last
    storage.put_json(dup["key"], dup, exclusive=True)
    reader = ShardReader(storage)
    res = reader.take(10)
    assert _ids(res.groups) == ["g0", "g1", "g2", "g3"]  # each group exactly once
    assert res.quarantined == 1
    assert (
        "names only its own writer's shard"
        in storage.get_json(keys.quarantine_key(dup["commit_id"]))["reason"]
    )


def test_same_commit_under_a_second_partition_is_delivered_once(storage: Storage) -> None:
    recs = _write(storage, 4)
    orig = recs[0]
    moved = {**orig.to_json(), "min_head_version": 1, "max_head_version": 1}
    moved["key"] = keys.commit_key(1, orig.writer, orig.seq)
    storage.put_json(moved["key"], moved, exclusive=True)
    reader = ShardReader(storage)
    got = reader.take(1).groups + reader.take(10).groups
    assert sorted(_ids(got)) == ["g0", "g1", "g2", "g3"]
    assert ShardReader(storage, ReaderCursor.from_json(reader.cursor.to_json())).take(10).groups == []
