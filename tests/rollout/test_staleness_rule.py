"""The staleness rule's hand-worked numbers, in one place (``rollflow.api.staleness``, module docstring).

B = the trainer's groups per step, S = rollout.max_staleness, v = the trainer version. Each check below
names the rule it holds: the capacity (admission), the claim gate, the acceptance bound (is_stale) and
the trainer's minimum trainable version. The callers (executor, prompt source, partials, trainer) are
covered in their own tests; these are the numbers they all get from here.
"""

from __future__ import annotations

import pytest

from rollflow.api.staleness import is_stale, max_samples, min_trainable_version
from rollflow.rollout.partials import PartialSample, judge_saved
from rollflow.rollout.staleness import StalenessManager


def test_max_samples_is_s_plus_v_plus_1_batches() -> None:
    assert max_samples(5, max_staleness=2, batch_size=64) == (2 + 5 + 1) * 64 == 512
    assert max_samples(0, max_staleness=0, batch_size=4) == 4  # the synchronous baseline: one batch ahead
    assert StalenessManager(1, 2, 64).max_samples(5) == 512


def test_capacity_v5_s2_b64_with_500_in_flight_is_12() -> None:
    m = StalenessManager(max_concurrent=1000, max_staleness=2, consumer_batch_size=64)
    m.restore(accepted=400)
    for _ in range(100):
        m.on_rollout_submitted()
    # min(1000 - 100, 512 - (400 + 100)) = min(900, 12) = 12
    assert m.get_capacity(5) == 12 and m.staleness_room(5) == 12


def test_claim_gate_b4_s1_k2_blocks_0_to_3_fit_at_v0_block_4_waits_for_v1() -> None:
    m = StalenessManager(max_concurrent=100, max_staleness=1, consumer_batch_size=4)
    # block b reserves (b + 1) * K positions; max_samples(0) = (1 + 0 + 1) * 4 = 8
    assert [m.claim_fits((b + 1) * 2, released=0, credited=0, version=0) for b in range(5)] == [
        True,  # 2 <= 8
        True,  # 4
        True,  # 6
        True,  # 8 <= 8
        False,  # 10 > 8
    ]
    assert m.claim_fits(10, released=0, credited=0, version=1)  # max_samples(1) = 12
    # released and credited positions give their room back: 10 - 1 - 1 = 8 <= 8
    assert m.claim_fits(10, released=1, credited=1, version=0)


def test_acceptance_bound_s1_b16_70_live_at_v2_rejects_heads_before_v3() -> None:
    m = StalenessManager(max_concurrent=100, max_staleness=1, consumer_batch_size=16)
    m.restore(accepted=70)
    # expected consumer = max(2, 70 // 16) = max(2, 4) = 4; bound = 4 - 1 = 3
    assert m.expected_consumer_version(2) == 4 and m.acceptance_bound(2) == 3
    assert m.is_stale(2, 2) and not m.is_stale(3, 2)
    assert not m.is_stale(-1, 2)  # no model token (a prompt-only group): never stale
    # a trainer already past the queue position sets the bound: max(6, 4) - 1 = 5
    assert m.acceptance_bound(6) == 5


def test_saved_partial_episodes_use_the_same_acceptance_bound() -> None:
    m = StalenessManager(max_concurrent=100, max_staleness=1, consumer_batch_size=16)
    m.restore(accepted=70)
    bound = m.acceptance_bound(2)  # 3, as above

    def sample(versions: list[int]) -> PartialSample:
        return PartialSample([1], list(range(len(versions))), [-0.5] * len(versions), versions, "abort", 8)

    kept, dropped, tokens = judge_saved({0: [sample([3, 4])], 1: [sample([2, 5])]}, bound=bound)
    assert list(kept) == [0] and (dropped, tokens) == (1, 2)  # episode 1's oldest token v2 < 3


@pytest.mark.parametrize(
    ("version", "s", "oldest"),
    [(7, 2, 5), (0, 0, 0), (1, 4, -3)],  # v - S; negative early on: nothing is stale yet
)
def test_trainer_min_trainable_version_is_v_minus_s(version: int, s: int, oldest: int) -> None:
    assert min_trainable_version(version, max_staleness=s) == oldest
    assert is_stale(oldest - 1, oldest) == (oldest - 1 >= 0) and not is_stale(oldest, oldest)
