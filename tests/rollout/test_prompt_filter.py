"""PromptCurriculum alone, and in the WorkflowExecutor: prompts whose last group was all solved or all
unsolved are not generated again (most of the time, each kind with its own probability), are released
like rejected groups, and the rest run as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pair_workflow import FakeClient, PairWorkflow

from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.prompt_filter import PromptCurriculum
from rollflow.rollout.prompt_source import ClaimedPrompts
from rollflow.rollout.staleness import StalenessManager
from storage.fs import Storage
from storage.prompt_claims import ClaimLog


def test_each_kind_is_skipped_with_its_own_probability_and_unseen_ones_never() -> None:
    f = PromptCurriculum(0.5, 0.2, seed=1)
    f.observe("solved", [1.0, 1.0, 1.0])
    f.observe("unsolved", [0.0, 0.0, 0.0])
    f.observe("signal", [0.0, 1.0, 1.0])
    assert [f.outcome(r) for r in ([1, 1], [0.5, 0.5], [0, 1], [1])] == [
        "solved",
        "unsolved",  # equal but below solved_reward (1.0)
        "signal",
        "solved",  # a group of one has no variance
    ]
    assert not any(f.skip("signal") for _ in range(200))
    assert not any(f.skip("unseen") for _ in range(200))
    n_solved = sum(f.skip("solved") for _ in range(2000))
    n_unsolved = sum(f.skip("unsolved") for _ in range(2000))
    assert 850 < n_solved < 1150  # about half, seeded
    assert 300 < n_unsolved < 500  # about a fifth
    assert f.skipped == {"solved": n_solved, "unsolved": n_unsolved, "signal": 0}
    f.observe("solved", [0.0, 1.0])  # revisited and now learning: never skipped
    assert not any(f.skip("solved") for _ in range(200))
    m = f.metrics()
    assert m["prompt_filter/signal_frac"] == pytest.approx(2 / 4)
    assert m["prompt_filter/solved_frac"] == m["prompt_filter/unsolved_frac"] == pytest.approx(1 / 4)
    assert m["prompt_filter/skipped_solved"] == n_solved
    with pytest.raises(ValueError, match="never revisit"):
        PromptCurriculum(1.0, 0.0)
    with pytest.raises(ValueError, match="skip_unsolved"):
        PromptCurriculum(0.0, -0.1)


def test_solved_reward_sets_what_counts_as_solved() -> None:
    f = PromptCurriculum(0.9, 0.0, solved_reward=0.5, seed=2)
    assert f.outcome([0.5, 0.5]) == "solved" and f.outcome([0.4, 0.4]) == "unsolved"
    f.observe("p", [0.4, 0.4])
    assert not any(f.skip("p") for _ in range(100))  # unsolved is never skipped at 0.0


def test_decisions_drawn_ahead_are_the_ones_applied_and_are_drawn_once() -> None:
    f = PromptCurriculum(0.5, 0.0, seed=3)
    for i in range(8):
        f.observe(f"p{i}", [1.0, 1.0])
    items = [(p, f"p{p}") for p in range(8)]
    n = f.decide_ahead(items)
    assert f.decide_ahead(items) == n  # a retried claim draws nothing new
    assert 0 < n < 8 and f.skipped["solved"] == 0  # counted when applied, not when drawn
    applied = [f.skip(f"p{p}", p) for p in range(8)]
    assert sum(applied) == n == f.skipped["solved"]
    f.decide_ahead([(20, "p0")])  # positions below a new block (claimed by another worker) are dropped
    assert list(f._ahead) == [20]


def _claim_until_blocked(
    storage: Storage, curriculum: PromptCurriculum | None, rows: list[dict[str, Any]]
) -> list[int]:
    """Pull prompts as an executor would, holding every started one, under a bound of 4 places:
    ``reserved - released <= 4`` with skipped prompts released when pulled (the loop's claim gate)."""
    released: list[int] = []
    src = ClaimedPrompts(
        rows, seed=1, max_epochs=None, claims=ClaimLog(storage), block_size=4, worker="w-1", name="w",
        fits=lambda reserved: reserved - len(released) <= 4,
        skips_ahead=None if curriculum is None else curriculum.decide_ahead,
    )  # fmt: skip
    started: list[int] = []
    for _ in range(200):
        item = next(src)
        if item is None:
            break
        p, row = item
        if curriculum is not None and curriculum.skip(row["prompt_id"], p):
            released.append(p)
        else:
            started.append(p)
    return started


@pytest.mark.parametrize("storage_spec", ["local"], indirect=True)
def test_a_block_mostly_skipped_does_not_hold_back_the_staleness_window(storage: Storage) -> None:
    # Every prompt's last group was solved; 3 in 4 are skipped. The bound leaves 4 places.
    rows = [{"prompt_id": f"p{i}"} for i in range(40)]
    curriculum = PromptCurriculum(0.75, 0.0, seed=5)
    for r in rows:
        curriculum.observe(r["prompt_id"], [1.0] * 4)
    started = _claim_until_blocked(storage, curriculum, rows)
    # With the skips counted out of each claim the window fills: 4 prompts start. (Counted in, as
    # before, a claim needs 4 free places, so after the first block only ~1 of 4 places would fill.)
    assert len(started) == 4
    assert curriculum.skipped["solved"] >= 4


@pytest.mark.parametrize("storage_spec", ["local"], indirect=True)
def test_without_a_curriculum_the_gate_is_unchanged(storage: Storage) -> None:
    started = _claim_until_blocked(storage, None, [{"prompt_id": f"p{i}"} for i in range(40)])
    assert started == [0, 1, 2, 3]  # one block of 4, then the bound


def test_executor_does_not_generate_flat_prompts_of_a_later_epoch() -> None:
    rows = [{"prompt_id": f"p{i}", "rewards": [1.0, 1.0] if i % 2 else [0.0, 1.0]} for i in range(20)]

    async def main() -> tuple[PairWorkflow, WorkflowExecutor, StalenessManager]:
        wf, sm = PairWorkflow(), StalenessManager(4, 100, 1)
        ex = WorkflowExecutor(
            wf, FakeClient(), sm, poll_interval_s=0.01, prompt_filter=PromptCurriculum(0.99, 0.99)
        )
        async with ex:
            for epoch in range(2):
                ex.feed(iter((f"e{epoch}-{r['prompt_id']}", r) for r in rows))
                await ex.await_idle()
        return wf, ex, sm

    wf, ex, sm = asyncio.run(main())
    first, second = wf.generated[:20], wf.generated[20:]
    assert sorted(first) == sorted(r["prompt_id"] for r in rows)  # unseen prompts always run
    varied = {f"p{i}" for i in range(0, 20, 2)}
    assert varied <= set(second)  # prompts with signal are generated again
    skipped = ex.stats.rejected["skipped"]
    assert skipped >= 8 and len(second) == 20 - skipped  # flat ones (10) mostly not generated
    assert ex.stats.accepted == 40 - skipped and sm.stat.running == 0
    assert sm.stat.accepted + sm.stat.rejected == 40 - skipped  # skipped rows never took capacity
    assert ex.stats.finished == 40  # but every fed row is finished: released or accepted


def test_a_skipped_prompt_runs_after_max_streak_skips_in_a_row() -> None:
    """The regression bound: at skip probability 0.9999 a solved prompt would almost never run; with
    max_streak 3 it is skipped exactly 3 times, then runs, and after each run (observed solved again) the
    streak starts over: over 12 passes it runs in passes 4, 8 and 12, i.e. once in every 3 + 1 passes.
    A prompt that regressed (its run gives a group with signal) is then never skipped."""
    f = PromptCurriculum(0.9999, 0.9999, seed=3, max_streak=3)
    f.observe("p", [1.0, 1.0])
    runs = []
    for n in range(1, 13):
        if not f.skip("p"):
            runs.append(n)
            f.observe("p", [1.0, 1.0])  # ran, still solved
    assert runs == [4, 8, 12]
    assert f.skipped["solved"] == 9
    for _ in range(3):
        assert f.skip("p")
    assert not f.skip("p")  # the 4th pass runs ...
    f.observe("p", [1.0, 0.0])  # ... and shows the regression: rewards differ
    assert not any(f.skip("p") for _ in range(50))
    # decided ahead (the prompt source's path) the bound holds too: position 7 comes after 3 skips
    g = PromptCurriculum(0.9999, 0.0, seed=4, max_streak=3)
    g.observe("q", [1.0])
    for position in range(4, 8):
        assert g.decide_ahead([(position, "q")]) == (1 if position < 7 else 0)
        assert g.skip("q", position) is (position < 7)
    with pytest.raises(ValueError, match="max_streak"):
        PromptCurriculum(0.5, 0.5, max_streak=-1)


def test_without_a_bound_the_same_prompt_stays_hidden() -> None:
    """The failure the bound prevents (hand-checked): at 0.9999 and no bound, 12 passes never run it."""
    f = PromptCurriculum(0.9999, 0.0, seed=3, max_streak=None)
    f.observe("p", [1.0, 1.0])
    assert all(f.skip("p") for _ in range(12))


def test_build_curriculum_passes_the_configured_bound() -> None:
    from rollflow.api.config import RolloutConfig
    from rollflow.rollout.prompt_filter import build_curriculum

    assert build_curriculum(RolloutConfig(), seed=1) is None  # off by default: the peers skip nothing
    c = build_curriculum(RolloutConfig(skip_solved_prob=0.9, curriculum_max_skips=2), seed=1)
    assert c is not None and c.max_streak == 2
