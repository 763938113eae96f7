"""Rows that cannot be true are refused where they enter storage, and quarantined where they are read.

- a trained token (loss_mask 1) with a negative version, on write and on read;
- a trained token newer than the newest published policy (the writer's ``version_ceiling``);
- a group whose rows carry two prompt ids, or two groups under one id (never merged into one group).

Each case checks the named error (``storage.errors``) and that the good groups around it still commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage_testlib import make_group

from storage import credits, keys
from storage.checkpoints import CheckpointStore
from storage.commits import CommitRecord
from storage.errors import (
    ImpossibleVersionError,
    InvalidTrajectoryError,
    MixedPromptGroupError,
    SchemaMismatchError,
)
from storage.fs import Storage
from storage.schema import (
    TRAJECTORY_SCHEMA,
    TrajectoryGroup,
    TrajectoryRow,
    groups_to_table,
    table_to_groups,
    validate_table,
)
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter

I32_MAX = 2**31 - 1


@pytest.fixture
def local(tmp_path) -> Storage:
    return Storage.open(str(tmp_path), "exp", "t", {})


def _raw_table(rows: list[TrajectoryRow]) -> pa.Table:
    """The rows as a shard table, with no validation (what a broken producer could write)."""
    return pa.Table.from_pylist([dataclasses.asdict(r) for r in rows], schema=TRAJECTORY_SCHEMA)


def _commit_raw(storage: Storage, table: pa.Table, groups: int) -> CommitRecord:
    """Commit ``table`` as a shard with a record whose size and sha256 match (a 'valid' commit)."""
    sink = io.BytesIO()
    pq.write_table(table, sink)
    blob = sink.getvalue()
    writer, seq = "forger-0badc0de", 0
    rec = CommitRecord(
        commit_id=keys.commit_id(writer, seq), key=keys.commit_key(0, writer, seq),
        shard_key=keys.shard_key(writer, f"{seq:08d}"), rows=table.num_rows, groups=groups,
        min_head_version=0, max_head_version=0, sha256=hashlib.sha256(blob).hexdigest(), size=len(blob),
        schema_version=1, writer=writer, seq=seq, created_at=0.0,
    )  # fmt: skip
    storage.put_bytes(rec.shard_key, blob)
    storage.put_bytes(rec.key, rec.to_bytes(), exclusive=True)
    return rec


def _quarantine_reason(storage: Storage, rec: CommitRecord) -> str:
    return str(storage.get_json(keys.quarantine_key(rec.commit_id))["reason"])


def _with_versions(group: TrajectoryGroup, version: int) -> TrajectoryGroup:
    """``group`` with every trained token at ``version`` and head/tail to match (not validated)."""
    for r in group.rows:
        r.versions = [version if m else -1 for m in r.loss_mask]
        r.head_version = r.tail_version = version
    return group


# --- versions -------------------------------------------------------------------------------------------


def test_a_negative_version_on_a_trained_token_is_refused_on_write(local: Storage) -> None:
    with pytest.raises(ImpossibleVersionError, match="trained token.*version -7"):
        TrajectoryRow.build(
            traj_id="r", group_id="g", prompt_id="p", input_ids=[1, 2], loss_mask=[0, 1],
            logprobs=[0.0, -0.1], versions=[-1, -7], reward=0.0, finish_reason="stop",
        )  # fmt: skip
    bad = _with_versions(make_group("bad"), -7)
    with pytest.raises(ImpossibleVersionError, match="'bad-r0'.*version -7") as err:
        groups_to_table([make_group("ok"), bad])
    assert err.value.field == "versions" and "loss_mask 0" in str(err.value)  # says how to fix it
    w = ShardWriter(local, "w", flush_rows=100)
    w.add(make_group("ok"))
    w.add(bad)
    with pytest.raises(InvalidTrajectoryError, match="'bad'.*version -7"):
        w.flush()
    w.close()
    assert [g.group_id for g in ShardReader(local).take(10).groups] == ["ok"]
    assert w.stats["evicted"] == 1


def test_a_version_on_a_prompt_token_may_be_minus_one() -> None:
    """-1 is what prompt and environment tokens carry (loss_mask 0): not refused."""
    validate_table(groups_to_table([make_group("ok")]))


@pytest.mark.parametrize("version", [6, I32_MAX])
def test_a_token_newer_than_the_published_policy_is_refused_on_write(local: Storage, version: int) -> None:
    """Ceiling 5 (LATEST names v5): a token at v6 or 2**31-1 cannot exist yet; one at v5 is written."""
    ceiling = [5]
    w = ShardWriter(local, "w", flush_rows=100, version_ceiling=lambda: ceiling[0])
    w.add(_with_versions(make_group("at-ceiling"), 5))
    w.add(_with_versions(make_group("future"), version))
    with pytest.raises(InvalidTrajectoryError, match=f"'future'.*version {version}.*v5"):
        w.flush()
    w.close()
    assert [g.group_id for g in ShardReader(local).take(10).groups] == ["at-ceiling"]
    assert w.stats["evicted"] == 1


def test_the_ceiling_is_read_at_each_flush_and_none_checks_only_the_lower_bound(local: Storage) -> None:
    ceiling: list[int | None] = [None]
    w = ShardWriter(local, "w", flush_rows=100, version_ceiling=lambda: ceiling[0])
    w.add(_with_versions(make_group("a"), 9))
    assert w.flush() is not None  # no checkpoint published yet: nothing to compare with
    ceiling[0] = 8
    w.add(_with_versions(make_group("b"), 9))
    with pytest.raises(InvalidTrajectoryError, match="version 9.*v8"):
        w.flush()
    ceiling[0] = 9  # v9 was published meanwhile: nothing was buffered, "b" was evicted
    w.add(_with_versions(make_group("c"), 9))
    assert w.flush() is not None
    assert sorted(g.group_id for g in ShardReader(local).take(10).groups) == ["a", "c"]


def test_a_group_newer_than_latest_is_refused_on_read_and_credited(local: Storage, tmp_path) -> None:
    """LATEST names v5 (the trainer may already hold v6 in memory; no token is v6 before it is
    published): of one shard, the group at v5 is delivered, the one at v6 refused and credited. Once v6
    is published, a group at v6 is delivered."""
    store = CheckpointStore(local)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    store.publish(tmp_path / "ckpt", 5)
    with ShardWriter(local, "w", flush_rows=100) as w:  # no ceiling on write: what a broken writer commits
        w.add(_with_versions(make_group("at-latest"), 5))
        w.add(_with_versions(make_group("future"), 6))
    reader = ShardReader(local, version_ceiling=store.latest_version)
    result = reader.take(10)
    assert [g.group_id for g in result.groups] == ["at-latest"] and result.refused_version == 1
    rec = reader.list_commits(include_consumed=True)[0]
    assert local.get_json(credits.credit_key(rec.partition, rec.commit_id))["dropped"] == [1]
    store.publish(tmp_path / "ckpt", 6)
    with ShardWriter(local, "w", flush_rows=100) as w:
        w.add(_with_versions(make_group("now-served"), 6))
    assert [g.group_id for g in reader.take(10).groups] == ["now-served"]
    assert reader.stats["refused_version"] == 1


def test_a_shard_with_a_negative_trained_version_is_quarantined_on_read(local: Storage) -> None:
    rec = _commit_raw(local, _raw_table(_with_versions(make_group("bad"), -7).rows), groups=1)
    result = ShardReader(local).take(10)
    assert result.groups == [] and result.quarantined == 1
    assert "'versions'" in _quarantine_reason(local, rec) and "-7" in _quarantine_reason(local, rec)


# --- one prompt per group ---------------------------------------------------------------------------------


def _mixed_rows() -> list[TrajectoryRow]:
    """Group g: row 0 for prompt 'p-a', row 1 for prompt 'p-b' (same group id)."""
    a, b = make_group("a").rows[0], make_group("b").rows[0]
    a.group_id = b.group_id = "g"
    b.traj_id = "g-r1"
    return [a, b]


def test_a_group_with_two_prompt_ids_is_refused_not_merged(local: Storage) -> None:
    rows = _mixed_rows()
    with pytest.raises(MixedPromptGroupError, match="group 'g' has rows of 2 prompts.*'p-a', 'p-b'"):
        validate_table(_raw_table(rows))
    with pytest.raises(MixedPromptGroupError, match="own group_id"):
        table_to_groups(_raw_table(rows))  # before: one group (g, p-a) holding a row of p-b
    group = TrajectoryGroup("g", "p-a", rows)
    with pytest.raises(MixedPromptGroupError, match="carries prompt 'p-b'") as err:
        ShardWriter(local, "w").add(group)
    assert isinstance(err.value, InvalidTrajectoryError) and isinstance(err.value, SchemaMismatchError)


def test_a_shard_with_a_mixed_group_is_quarantined_on_read(local: Storage) -> None:
    rec = _commit_raw(local, _raw_table(_mixed_rows()), groups=1)
    result = ShardReader(local).take(10)
    assert result.groups == [] and result.quarantined == 1
    assert "2 prompts" in _quarantine_reason(local, rec)


def test_two_groups_under_one_id_are_refused_on_write(local: Storage) -> None:
    """Two groups with one id in one shard would be read back as one group: the second is evicted."""
    first, second = make_group("g"), make_group("g", seed=1)
    w = ShardWriter(local, "w", flush_rows=100)
    w.add(first)
    w.add(make_group("other"))
    w.add(second)
    with pytest.raises(InvalidTrajectoryError, match="group id 'g' is already in this shard"):
        w.flush()
    w.close()
    got = ShardReader(local).take(10).groups
    assert [g.group_id for g in got] == ["g", "other"]
    assert [r.input_ids for r in got[0].rows] == [r.input_ids for r in first.rows]  # the first one kept
