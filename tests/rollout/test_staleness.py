"""StalenessManager: AReaL's capacity rule with hand-worked numbers, restore after restart, thread safety."""

from __future__ import annotations

import threading

import pytest

from rollflow.rollout.staleness import RolloutStat, StalenessManager


def _with_counts(m: StalenessManager, *, accepted: int, running: int) -> None:
    m.restore(accepted=accepted)
    for _ in range(running):
        m.on_rollout_submitted()


def test_seed_example_version5_staleness2_batch64_500_in_flight_gives_12() -> None:
    m = StalenessManager(max_concurrent=1000, max_staleness=2, consumer_batch_size=64)
    _with_counts(m, accepted=400, running=100)
    # staleness room: (2 + 5 + 1) * 64 - (400 + 100) = 512 - 500 = 12
    # concurrency room: 1000 - 100 = 900  -> min = 12
    assert m.max_samples(5) == 512
    assert m.get_capacity(5) == 12


def test_concurrency_bound_wins_when_staleness_room_is_large() -> None:
    m = StalenessManager(max_concurrent=8, max_staleness=4, consumer_batch_size=64)
    _with_counts(m, accepted=0, running=5)
    # concurrency room 8 - 5 = 3; staleness room (4 + 0 + 1) * 64 - 5 = 315 -> 3
    assert m.get_capacity(0) == 3


def test_synchronous_baseline_one_batch_per_version() -> None:
    # max_staleness 0, B 4: at version v at most (v + 1) * 4 groups may ever exist.
    m = StalenessManager(max_concurrent=100, max_staleness=0, consumer_batch_size=4)
    assert m.get_capacity(0) == 4  # min(100, 1 * 4 - 0)
    for _ in range(4):
        assert m.try_submit(0)
    assert not m.try_submit(0)  # 4 running: (0 + 0 + 1) * 4 - 4 = 0
    for _ in range(4):
        m.on_rollout_accepted()
    assert m.get_capacity(0) == 0  # 4 accepted, still 0 until the trainer moves on
    assert m.get_capacity(1) == 4  # (0 + 1 + 1) * 4 - 4 = 4
    m.on_rollout_submitted()
    m.on_rollout_rejected()  # a rejected episode gives its slot back
    assert m.get_capacity(1) == 4
    assert m.stat == RolloutStat(enqueued=0, submitted=5, running=0, accepted=4, rejected=1)


def test_capacity_can_be_negative_and_nothing_starts() -> None:
    m = StalenessManager(max_concurrent=10, max_staleness=1, consumer_batch_size=16)
    m.restore(accepted=100)
    # (1 + 3 + 1) * 16 - 100 = 80 - 100 = -20
    assert m.get_capacity(3) == -20
    assert not m.try_submit(3)
    assert m.stat.running == 0


def test_restore_keeps_the_bound_after_a_restart_bug_1388() -> None:
    """A fresh manager would grant 80 at version 3; the restored one grants what is left of the bound."""
    fresh = StalenessManager(max_concurrent=1000, max_staleness=1, consumer_batch_size=16)
    assert fresh.get_capacity(3) == 80  # (1 + 3 + 1) * 16 - 0: the AReaL #1388 over-admission
    restored = StalenessManager(max_concurrent=1000, max_staleness=1, consumer_batch_size=16)
    restored.restore(accepted=70, rejected=9)
    assert restored.get_capacity(3) == 10  # 80 - 70
    assert restored.stat.accepted == 70 and restored.stat.rejected == 9
    restored.on_rollout_submitted()
    with pytest.raises(RuntimeError, match="running"):
        restored.restore(accepted=0)


def test_version_fn_is_used_when_no_version_is_given() -> None:
    version = {"v": 0}
    m = StalenessManager(
        max_concurrent=50, max_staleness=1, consumer_batch_size=3, version_fn=lambda: version["v"]
    )
    assert m.get_capacity() == 6  # (1 + 0 + 1) * 3
    version["v"] = 2
    assert m.get_capacity() == 12  # (1 + 2 + 1) * 3
    assert m.last_version == 2
    no_fn = StalenessManager(max_concurrent=1, max_staleness=0, consumer_batch_size=1)
    with pytest.raises(ValueError, match="version"):
        no_fn.get_capacity()


def test_expected_consumer_version_is_the_queue_position() -> None:
    m = StalenessManager(max_concurrent=10, max_staleness=1, consumer_batch_size=16)
    m.restore(accepted=70)
    assert m.expected_consumer_version(2) == 4  # 70 // 16 = 4 > 2
    assert m.expected_consumer_version(6) == 6  # the trainer is already past the queue position


def test_listeners_see_every_event_with_counts_after_it() -> None:
    seen: list[tuple[str, int, int, int]] = []
    m = StalenessManager(
        max_concurrent=4,
        max_staleness=0,
        consumer_batch_size=2,
        listeners=[lambda e, s, v: seen.append((e, s.running, s.accepted, v))],
    )
    m.on_rollout_enqueued(2)
    assert m.try_submit(7)
    assert m.try_submit(7)
    m.on_rollout_accepted()
    m.on_rollout_rejected()
    assert seen == [
        ("enqueued", 0, 0, 0),
        ("submitted", 1, 0, 7),
        ("submitted", 2, 0, 7),
        ("accepted", 1, 1, 7),
        ("rejected", 0, 1, 7),
    ]
    assert m.stat.waiting == 0


def test_broken_listener_does_not_break_accounting() -> None:
    def bad(*_: object) -> None:
        raise RuntimeError("boom")

    m = StalenessManager(max_concurrent=1, max_staleness=0, consumer_batch_size=1, listeners=[bad])
    assert m.try_submit(0)
    m.on_rollout_accepted()
    assert m.stat.accepted == 1


def test_accepting_without_running_episode_raises() -> None:
    m = StalenessManager(max_concurrent=1, max_staleness=0, consumer_batch_size=1)
    with pytest.raises(RuntimeError, match="without a running episode"):
        m.on_rollout_accepted()


def test_try_submit_is_atomic_across_threads() -> None:
    # capacity at version 0: min(1000, (4 + 0 + 1) * 10) = 50; 8 threads x 200 attempts -> exactly 50.
    m = StalenessManager(max_concurrent=1000, max_staleness=4, consumer_batch_size=10)
    wins = [0] * 8
    go = threading.Event()

    def hammer(i: int) -> None:
        go.wait()
        for _ in range(200):
            if m.try_submit(0):
                wins[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    assert sum(wins) == 50
    assert m.stat.running == 50


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_concurrent": 0, "max_staleness": 0, "consumer_batch_size": 1}, "max_concurrent"),
        ({"max_concurrent": 1, "max_staleness": -1, "consumer_batch_size": 1}, "max_staleness"),
        ({"max_concurrent": 1, "max_staleness": 0, "consumer_batch_size": 0}, "consumer_batch_size"),
    ],
)
def test_invalid_arguments_name_the_field(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        StalenessManager(**kwargs)


def test_credits_reopen_capacity_with_max_staleness_0() -> None:
    """B = 2, max_staleness = 0, version 0: 2 groups exist -> room (0 + 0 + 1) * 2 - 2 = 0. The trainer
    quarantines their shard: 2 credited -> live 2 - 2 = 0 -> room 2 again."""
    m = StalenessManager(max_concurrent=10, max_staleness=0, consumer_batch_size=2)
    m.restore(accepted=2)
    assert m.get_capacity(0) == 0
    m.sync(accepted=2, credited=2, own_visible=0)
    assert m.get_capacity(0) == 2 and m.live == 0 and m.credited == 2
    # a restart restores both numbers from storage: the same room
    r = StalenessManager(max_concurrent=10, max_staleness=0, consumer_batch_size=2)
    r.restore(accepted=2, credited=2)
    assert r.get_capacity(0) == 2


def test_global_live_count_with_own_unseen_and_evicted_groups() -> None:
    """live = (G - C) + (local accepted - restored - evicted - own visible)."""
    m = StalenessManager(max_concurrent=100, max_staleness=1, consumer_batch_size=4)
    m.restore(accepted=6, credited=1)  # G 6, C 1 -> live 5
    for _ in range(3):
        assert m.try_submit(0)
        m.on_rollout_accepted()  # 3 accepted here, none visible in storage yet -> live 8
    assert m.live == 8 and m.accepted_total == 9
    m.on_evicted(1)  # the writer dropped one as invalid -> live 7
    assert m.live == 7
    # storage now shows this process's 2 committed groups and 5 more from another writer
    m.sync(accepted=6 + 2 + 5, credited=1, own_visible=2)
    # (13 - 1) + (3 - 1 - 2) = 12; room at version 2: (1 + 2 + 1) * 4 - 12 = 4
    assert m.live == 12 and m.get_capacity(2) == 4
    assert m.expected_consumer_version(0) == 12 // 4
    with pytest.raises(ValueError, match="credited <= accepted"):
        m.sync(accepted=1, credited=2, own_visible=0)
