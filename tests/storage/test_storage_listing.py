"""Incremental listing: a trainer poll costs O(hot partitions) LIST calls, flat as the run grows, and a
late commit into an old partition is still found (by the periodic sweep). Local dir and moto S3."""

from __future__ import annotations

from typing import Any

import pytest
from storage_testlib import make_group

from storage.fs import Storage
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter


class ListCounter:
    """Counts `list` / `list_dirs` calls on a real Storage (each is one LIST request for < 1000 keys)."""

    def __init__(self, storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for name in ("list", "list_dirs"):
            real = getattr(storage, name)
            monkeypatch.setattr(storage, name, self._wrap(real))

    def _wrap(self, fn: Any) -> Any:
        def counted(*a: Any, **k: Any) -> Any:
            self.calls += 1
            return fn(*a, **k)

        return counted

    def delta(self, fn: Any) -> int:
        before = self.calls
        fn()
        return self.calls - before


def _commit(storage: Storage, head: int, gid: str) -> None:
    with ShardWriter(storage, "w", flush_rows=1) as w:
        w.add(make_group(gid, head=head))


def test_list_calls_per_poll_stay_flat_as_partitions_grow(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    for v in range(20):
        _commit(storage, v, f"g{v}")
    now = [0.0]
    reader = ShardReader(storage, hot_window=2, sweep_s=100.0)
    reader.lister._clock = lambda: now[0]
    counter = ListCounter(storage, monkeypatch)
    # first poll: the partition names + all 20 partitions (a sweep)
    assert counter.delta(lambda: reader.take(100)) == 1 + 20
    per_poll = []
    for v in range(20, 40):  # the run goes on: one new partition per "version"
        _commit(storage, v, f"g{v}")
        before = counter.calls
        got = reader.take(100).groups
        per_poll.append(counter.calls - before)
        assert [g.group_id for g in got] == [f"g{v}"]
    # each poll: 1 (partition names) + the 3 newest partitions (hot_window 2), at 21 or at 40 partitions
    assert per_poll == [1 + 3] * 20

    # a late commit into an old partition (an episode that ran very long) waits for the sweep
    _commit(storage, 3, "late")
    assert reader.take(100).groups == []
    now[0] = 100.0  # sweep_s later: this poll lists all 40 partitions once
    before = counter.calls
    got = reader.take(100).groups
    assert counter.calls - before == 1 + 40
    assert [g.group_id for g in got] == ["late"]
    assert reader.lister.polls == 23
