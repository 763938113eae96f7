"""PromptReview alone, and in the WorkflowExecutor: solved prompts come back once they are due, in place
of fresh prompts, never above the share; a review that still solves waits twice as long, a mixed one is
due again soon, an all-wrong one leaves the set; the executor's slots and capacity are unchanged."""

from __future__ import annotations

import asyncio

import pytest
from pair_workflow import FakeClient, PairWorkflow

from rollflow.api.config import RolloutConfig
from rollflow.api.errors import ConfigError
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.prompt_review import PromptReview, build_review
from rollflow.rollout.staleness import StalenessManager


def _row(i: int) -> dict:
    return {"prompt_id": f"p{i}"}


def _run(review: PromptReview, i: int, version: int, rewards: list[float]) -> str:
    """Start fed prompt ``i`` at ``version``; finish whatever ran in its slot with ``rewards``."""
    pid = review.swap(_row(i), version)["prompt_id"]
    review.observe(pid, rewards, version)
    return pid


def test_a_solved_prompt_comes_back_when_due_and_its_interval_doubles_while_it_holds() -> None:
    r = PromptReview(0.5, 2)
    assert _run(r, 0, 0, [1.0, 1.0]) == "p0" and len(r) == 1  # mastered at v0: due at v2
    assert _run(r, 1, 1, [0.0, 1.0]) == "p1"  # not due yet: the fresh prompt runs
    assert _run(r, 2, 2, [1.0, 1.0]) == "p0"  # due: it takes the slot (p2 comes back next epoch)
    assert r.counts == {"reviewed": 1, "held": 1, "regressed": 0, "lost": 0}
    # held at v2: interval 4, due at v6; the share (0.5) allows another review, but none is due
    assert [_run(r, i, v, [0.0, 1.0]) for i, v in ((3, 3), (4, 5))] == ["p3", "p4"]
    assert _run(r, 5, 6, [1.0, 1.0]) == "p0"
    assert r._cards["p0"].interval == 8


def test_a_partial_regression_is_due_again_soon_and_a_lost_prompt_leaves_the_set() -> None:
    r = PromptReview(0.5, 4)
    _run(r, 0, 0, [1.0, 1.0])
    _run(r, 1, 0, [1.0, 1.0])
    assert _run(r, 9, 4, [1.0, 0.0]) == "p0"  # reviewed and mixed: caught while partial
    assert r._cards["p0"].interval == 4 and r._cards["p0"].due == 8
    _run(r, 8, 4, [0.0, 1.0])  # fresh: the share (0.5 of 2 started) is spent on the review
    assert _run(r, 7, 4, [0.0, 0.0]) == "p1"  # reviewed and wrong in every sample: lost
    assert "p1" not in r._cards and "p0" in r._cards
    assert r.counts == {"reviewed": 2, "held": 0, "regressed": 1, "lost": 1}
    # a fresh pass of p0 (its own epoch) that solves puts it back on schedule, no doubling
    _run(r, 0, 6, [1.0, 1.0])
    assert r._cards["p0"].interval == 4 and r._cards["p0"].due == 10


def test_reviews_never_exceed_the_share_of_any_run_of_slots_and_never_burst() -> None:
    r = PromptReview(0.25, 1)
    for i in range(40):  # 40 mastered prompts, all due from v1 on; 40 slots with nothing due
        _run(r, i, 0, [1.0])
    ran = [_run(r, 100 + i, 1, [0.5, 1.0]) for i in range(40)]
    reviewed_at = [k for k, pid in enumerate(ran) if int(pid[1:]) < 100]
    assert reviewed_at == list(range(0, 40, 4))  # one slot in 4, not the 20 the idle slots would bank
    assert r.metrics()["review/share"] == pytest.approx(10 / 80)


def test_config_bounds_and_off_by_default() -> None:
    assert build_review(RolloutConfig()) is None  # the peers review nothing
    built = build_review(RolloutConfig(review_share=0.25, review_interval=3))
    assert built is not None and (built.share, built.interval) == (0.25, 3)
    with pytest.raises(ConfigError, match="review_share"):
        RolloutConfig(review_share=0.75)
    with pytest.raises(ConfigError, match="review_interval"):
        RolloutConfig(review_share=0.1, review_interval=0)


def test_executor_reviews_solved_prompts_in_fed_slots_without_extra_generation() -> None:
    """Two epochs of 20 prompts, the odd ones always solved, review share 0.25 at interval 1 (the trainer's
    version, moved by hand, goes from 0 to 1 between the epochs). The second epoch starts exactly its 20
    slots, and one in 4 ran a solved prompt in place of a fresh one."""
    rows = [{"prompt_id": f"p{i}", "rewards": [1.0, 1.0] if i % 2 else [0.0, 1.0]} for i in range(20)]
    version = [0]

    async def main() -> tuple[PairWorkflow, WorkflowExecutor, StalenessManager]:
        wf, sm = PairWorkflow(), StalenessManager(4, 100, 1)
        ex = WorkflowExecutor(
            wf, FakeClient(), sm, poll_interval_s=0.01, review=PromptReview(0.25, 1),
            version_fn=lambda: version[0],
        )  # fmt: skip
        async with ex:
            ex.feed(iter((f"e0-{r['prompt_id']}", r) for r in rows))
            await ex.await_idle()
            version[0] = 1  # the trainer moved: every solved prompt is due
            ex.feed(iter((f"e1-{r['prompt_id']}", r) for r in rows))
            await ex.await_idle()
        return wf, ex, sm

    wf, ex, sm = asyncio.run(main())
    first, second = wf.generated[:20], wf.generated[20:]
    assert sorted(first) == sorted(r["prompt_id"] for r in rows)  # the first pass: nothing mastered yet
    assert len(second) == 20 and ex.stats.finished == 40  # one group per slot, no more
    assert ex.review is not None and ex.review.counts == {"reviewed": 5, "held": 5, "regressed": 0, "lost": 0}
    # slots 0, 4, 8, 12, 16 of the second pass ran solved prompts; their own prompts wait for the next pass
    assert {r["prompt_id"] for r in rows} - set(second) == {"p0", "p4", "p8", "p12", "p16"}
    assert sum(p in {f"p{i}" for i in range(1, 20, 2)} for p in second) == 10 + 5
    assert sm.stat.accepted == 40 and sm.stat.running == 0
