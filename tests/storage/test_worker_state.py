"""Rollout workers' state files (`storage.worker_state`) on real storage (local dir and moto S3): a worker's
own earlier life, its peers' heartbeats, who adopted a block, and the keys in `storage.keys`."""

from __future__ import annotations

import pytest

from storage import keys
from storage.fs import Storage
from storage.prompt_claims import ClaimLog
from storage.worker_state import STATE_FORMAT, WorkerState, WorkerStateStore, is_incarnation_of


def _state(name: str, **kw: object) -> WorkerState:
    base: dict[str, object] = {
        "writer": name,
        "incarnation": f"{name}-0123abcd",
        "epoch": 1,
        "position": 3,
        "blocks": {"4": {"gen": 0, "open": [9, 11]}},
        "accepted": 5,
        "rejected": 2,
        "failed": 1,
        "released": 3,
        "updated_at": 1000.0,
    }
    return WorkerState(**(base | kw))  # type: ignore[arg-type]


def test_a_fresh_worker_has_no_earlier_life_and_a_put_state_reads_back(storage: Storage) -> None:
    store = WorkerStateStore(storage, "w0")
    assert store.load() is None
    store.put(_state("w0"))
    assert store.key == keys.rollout_state_key("w0") == "rollout/state-w0.json"
    assert store.load() == _state("w0")
    doc = storage.get_json(store.key)  # the file other workers and `rollflow ls` read
    assert doc["format"] == STATE_FORMAT == 2 and doc["released"] == 3 and doc["updated_at"] == 1000.0


def test_a_format_1_file_gives_only_its_counters_and_an_unknown_one_says_what_to_do(storage: Storage) -> None:
    store = WorkerStateStore(storage, "old")
    storage.put_json(store.key, {"format": 1, "rejected": 4, "failed": 2, "position": 7})
    assert store.load() == WorkerState(rejected=4, failed=2)  # one writer, no claims: nothing to adopt
    storage.put_json(store.key, {"format": 99})
    with pytest.raises(ValueError, match="unknown format; delete it to start the data over"):
        store.load()


def test_others_are_every_readable_peer_state_but_this_workers_own(storage: Storage) -> None:
    me = WorkerStateStore(storage, "w0")
    me.put(_state("w0"))
    WorkerStateStore(storage, "w1").put(_state("w1", released=4, updated_at=None))
    WorkerStateStore(storage, "w2").put(_state("w2", released=6))
    storage.put_json(keys.rollout_state_key("w3"), {"format": 1, "released": 100})  # an old format: skipped
    storage.put_bytes(keys.rollout_state_key("w4"), b"{half a docu")  # a torn write: skipped
    storage.put_json(keys.partials_key("w5-0123abcd"), {"format": 2, "released": 50})  # not a state file
    peers = sorted(me.others(), key=lambda s: s.writer)
    assert [p.writer for p in peers] == ["w1", "w2"]
    assert sum(p.released for p in peers) == 4 + 6  # what enters this worker's claim gate
    assert peers[0].updated_at is None and peers[1].updated_at == 1000.0  # no stamp: never lease-expired


def test_taken_over_by_names_the_adopting_writer(storage: Storage) -> None:
    store = WorkerStateStore(storage, "w0")
    assert store.taken_over_by(4, 1) == ""  # nobody adopted block 4 for generation 1
    assert ClaimLog(storage).try_take_over(4, 1, "w0-deadbeef")
    assert not ClaimLog(storage).try_take_over(4, 1, "w1-0123abcd")  # one exclusive put decides
    assert store.taken_over_by(4, 1) == "w0-deadbeef"
    assert (
        storage.exists(keys.takeover_key(4, 1))
        and keys.takeover_key(4, 1) == "prompts/takeovers/0000000004-001.json"
    )


def test_incarnations_are_the_name_and_eight_hex_digits() -> None:
    assert is_incarnation_of("rollout-w0-0123abcd", "rollout-w0")
    assert not is_incarnation_of("rollout-w0-0123abcd", "rollout")  # another worker whose name extends it
    assert not is_incarnation_of("rollout-w0-0123abcdx", "rollout-w0")
    assert not is_incarnation_of("rollout-w1-0123abcd", "rollout-w0")
    assert is_incarnation_of("a.b-ffffffff", "a.b") and not is_incarnation_of("axb-ffffffff", "a.b")


def test_state_and_claim_keys_live_in_keys() -> None:
    assert keys.is_rollout_state_key("rollout/state-w0.json")
    assert not keys.is_rollout_state_key("rollout/partials/w0-0123abcd.json")
    assert keys.claim_key(1234) == "prompts/claims/000001/0000001234.json"
    with pytest.raises(ValueError, match="gen >= 1"):
        keys.takeover_key(3, 0)
    assert keys.consumed_key(7) == "trainer/consumed/step-00000007.json"
    assert (
        keys.parse_consumed_key(keys.consumed_key(7)) == 7
        and keys.parse_consumed_key("trainer/x.json") is None
    )


def test_a_state_built_earlier_never_replaces_a_later_one_in_the_file(storage: Storage) -> None:
    store = WorkerStateStore(storage, "w0")
    heartbeat = _state("w0", accepted=5, seq=store.next_seq())  # built first ...
    commit = _state("w0", accepted=6, seq=store.next_seq())  # ... then a commit's state
    assert store.put(commit)
    assert not store.put(heartbeat)  # the heartbeat's put lands last: skipped
    assert store.load() == commit and storage.get_json(store.key)["seq"] == commit.seq == 2


def test_a_restarted_worker_stamps_after_its_earlier_life(storage: Storage) -> None:
    first = WorkerStateStore(storage, "w0")
    for _ in range(3):
        first.put(_state("w0", seq=first.next_seq()))
    again = WorkerStateStore(storage, "w0")  # the next life, one worker per name
    assert again.load() == _state("w0", seq=3)
    late = _state("w0", accepted=9, seq=again.next_seq())
    assert late.seq == 4 and again.put(late) and again.load() == late
    storage.put_json(again.key, {"format": 2})
    assert WorkerStateStore(storage, "w0").load() == WorkerState()  # a file without seq reads as 0
