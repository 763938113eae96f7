"""Readers never follow a symlink out of the trial root (local storage).

A shard, a commit record or a whole partition directory replaced by a link to a copy outside the trial
root has the right bytes (size and sha256 match the record), so only the path tells it apart: the reader
quarantines the shard or record with a reason naming the link, and a listing skips the directory. A link
that stays inside the root is read as before.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from storage_testlib import make_group

from storage import keys
from storage.errors import UnsafePathError
from storage.fs import Storage
from storage.group_ledger import GroupLedger
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter


@pytest.fixture
def root(tmp_path: Path) -> tuple[Storage, Path]:
    """A trial with two commits of one group each, and a directory outside its root."""
    storage = Storage.open(str(tmp_path / "root"), "exp", "t", {})
    with ShardWriter(storage, "w", flush_rows=2) as w:
        w.add(make_group("g0"))
        w.add(make_group("g1"))
    outside = tmp_path / "outside"
    outside.mkdir()
    return storage, outside


def _link_out(storage: Storage, key: str, outside: Path) -> Path:
    """Move ``key``'s file outside the root and leave a symlink to it in its place."""
    path = storage.local_path(key)
    assert path is not None
    target = outside / path.name
    shutil.move(path, target)
    os.symlink(target, path)
    return target


def _reason(storage: Storage, commit_id: str) -> str:
    return str(storage.get_json(keys.quarantine_key(commit_id))["reason"])


def test_a_shard_linked_out_of_the_root_is_quarantined_not_read(root: tuple[Storage, Path]) -> None:
    storage, outside = root
    first, second = ShardReader(storage).list_commits()
    _link_out(storage, first.shard_key, outside)  # the same bytes: size and sha256 still match
    with pytest.raises(UnsafePathError, match="outside the trial root .*Remove the link"):
        storage.get_bytes(first.shard_key)
    result = ShardReader(storage).take(10)
    assert [g.group_id for g in result.groups] == ["g1"] and result.quarantined == 1
    assert "outside the trial root" in _reason(storage, first.commit_id)


def test_a_commit_record_linked_out_of_the_root_is_quarantined(root: tuple[Storage, Path]) -> None:
    storage, outside = root
    first, _ = ShardReader(storage).list_commits()
    _link_out(storage, first.key, outside)
    result = ShardReader(storage).take(10)
    assert [g.group_id for g in result.groups] == ["g1"] and result.quarantined == 1
    assert "outside the trial root" in _reason(storage, first.commit_id)
    assert GroupLedger(storage).refresh().accepted == 1  # the rollout's count skips it too, no crash


def test_a_partition_linked_out_of_the_root_is_not_listed(
    root: tuple[Storage, Path], caplog: pytest.LogCaptureFixture
) -> None:
    storage, outside = root
    records = ShardReader(storage).list_commits()
    partition = storage.local_path(f"{keys.COMMIT_DIR}/v000000")
    assert partition is not None and all(r.partition == 0 for r in records)
    shutil.move(partition, outside / "v000000")
    os.symlink(outside / "v000000", partition)
    with caplog.at_level(logging.ERROR, logger="storage.fs"):
        assert storage.list_dirs(keys.COMMIT_DIR) == []
        assert storage.list(f"{keys.COMMIT_DIR}/v000000") == []
        assert storage.list(keys.COMMIT_DIR) == []
        assert ShardReader(storage).take(10).groups == []
    assert "outside the trial root" in caplog.text and "remove the link" in caplog.text


def test_a_link_that_stays_inside_the_root_is_read(root: tuple[Storage, Path]) -> None:
    storage, _ = root
    first, _second = ShardReader(storage).list_commits()
    path = storage.local_path(first.shard_key)
    assert path is not None
    moved = path.with_name("moved.bin")
    shutil.move(path, moved)
    os.symlink(moved, path)
    assert [g.group_id for g in ShardReader(storage).take(10).groups] == ["g0", "g1"]
