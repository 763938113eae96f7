"""BatchCollector: exact counts, stale accounting, stop and timeout, against a 10-line fake reader."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from rollflow.api.errors import TrainerError
from rollflow.training.source import BatchCollector


@dataclass
class FakeTake:
    groups: list
    dropped_stale: int = 0
    quarantined: int = 0
    commit_latency_s: list = field(default_factory=list)


class FakeReader:
    """Serves (group, head_version) pairs in order; a script of how many become visible per call."""

    def __init__(self, items: list[tuple[str, int]], visible: list[int]) -> None:
        self.items, self.visible, self.pos, self.calls = items, visible, 0, []

    def take(self, n: int, *, min_head_version: int | None = None) -> FakeTake:
        self.calls.append(n)
        limit = self.visible.pop(0) if self.visible else len(self.items)
        out = FakeTake([])
        while self.pos < limit and len(out.groups) < n:
            gid, head = self.items[self.pos]
            self.pos += 1
            if min_head_version is not None and head < min_head_version:
                out.dropped_stale += 1
            else:
                out.groups.append(gid)
        return out


def test_collects_exactly_n_across_polls_and_counts_stale() -> None:
    items = [("a", 5), ("old", 1), ("b", 5), ("c", 6), ("d", 6)]
    reader = FakeReader(items, visible=[1, 1, 2, 4, 5])  # trickles in
    c = BatchCollector(reader, timeout_s=10, poll_interval_s=0.001)
    got = c.collect(3, min_head_version=3)
    assert got is not None and got.groups == ["a", "b", "c"] and got.dropped_stale == 1
    assert reader.pos == 4  # "d" untouched: never more than asked
    assert all(n <= 3 for n in reader.calls)


def test_stop_event_returns_none() -> None:
    stop = threading.Event()
    reader = FakeReader([], visible=[])
    c = BatchCollector(reader, timeout_s=100, poll_interval_s=0.01, stop_event=stop)
    threading.Timer(0.05, stop.set).start()
    assert c.collect(2, min_head_version=None) is None


def test_timeout_without_new_data_raises() -> None:
    c = BatchCollector(FakeReader([], visible=[]), timeout_s=0.05, poll_interval_s=0.01)
    with pytest.raises(TrainerError, match="no new trajectory group"):
        c.collect(1, min_head_version=None)


def test_a_waiting_collector_says_what_it_waits_for(caplog: pytest.LogCaptureFixture) -> None:
    ticks = iter(range(0, 10_000, 10))  # each clock read is 10 s later
    reader = FakeReader([("a", 5), ("b", 5)], visible=[1, 1, 1, 1, 2])
    c = BatchCollector(
        reader, timeout_s=1000, poll_interval_s=0.001, clock=lambda: float(next(ticks)), report_every_s=30
    )
    with caplog.at_level("INFO", logger="rollflow.training.source"):
        got = c.collect(2, min_head_version=4)
    assert got is not None and got.groups == ["a", "b"]
    waits = [r.getMessage() for r in caplog.records if "trainer waiting" in r.getMessage()]
    assert waits and "waiting for 1 more trajectory group(s) with head_version >= 4 (1/2 in hand)" in waits[0]
    assert "gives up after 1000 s" in waits[0]


class FlakyReader(FakeReader):
    """Raises on the calls listed in ``fail_on`` (0-based), like a storage read that outlasted retries."""

    def __init__(self, items: list[tuple[str, int]], fail_on: set[int]) -> None:
        super().__init__(items, visible=[])
        self.fail_on, self.n = fail_on, 0

    def take(self, n: int, *, min_head_version: int | None = None) -> FakeTake:
        self.n += 1
        if self.n - 1 in self.fail_on:
            raise OSError("connection reset by peer")
        return super().take(n, min_head_version=min_head_version)


def test_transient_read_errors_are_retried() -> None:
    reader = FlakyReader([("a", 0), ("b", 0)], fail_on={0, 1})
    got = BatchCollector(reader, timeout_s=10, poll_interval_s=0.001).collect(2, min_head_version=None)
    assert got is not None and got.groups == ["a", "b"] and reader.n == 3


def test_persistent_read_errors_raise_trainer_error() -> None:
    reader = FlakyReader([("a", 0)], fail_on=set(range(100)))
    c = BatchCollector(reader, timeout_s=100, poll_interval_s=0.001, max_read_failures=3)
    with pytest.raises(TrainerError, match="3 consecutive reads.*connection reset"):
        c.collect(1, min_head_version=None)
    assert reader.n == 3
