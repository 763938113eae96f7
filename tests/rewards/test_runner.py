"""AsyncRewardRunner against real worker processes: scores, failures, hangs, deaths, stats, close."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from rollflow.api.errors import WorkflowImportError
from rollflow.rewards import AsyncRewardRunner, RewardOutcome, reward_fn_name
from rollflow.rewards.synthetic import synthetic_reward_fn

FAKES = "reward_fakes"  # tests/rewards/reward_fakes.py, on sys.path under pytest's rootdir import mode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def _worker_pids(runner: AsyncRewardRunner) -> list[int]:
    return [w.process.pid for w in runner._workers]


def test_scores_by_function_or_import_string() -> None:
    async def main() -> tuple[RewardOutcome, RewardOutcome]:
        async with AsyncRewardRunner(synthetic_reward_fn, max_workers=1, timeout_s=30) as a:
            right = await a.ascore("12+35=", "47", "47")
        async with AsyncRewardRunner(
            "rollflow.rewards.math:gsm8k_reward_fn", max_workers=1, timeout_s=30
        ) as b:
            gsm = await b.ascore("q", "3*4=12. #### 12", "... #### 12")
        return right, gsm

    right, gsm = asyncio.run(main())
    assert right == RewardOutcome(1.0, None, False)
    assert gsm == RewardOutcome(1.0, None, False)


def test_data_kwargs_reach_the_function() -> None:
    async def main() -> list[RewardOutcome]:
        async with AsyncRewardRunner(f"{FAKES}:echo_len_reward_fn", max_workers=1, timeout_s=30) as r:
            return [await r.ascore("p", "abc", "x"), await r.ascore("p", "abc", "x", bonus=10)]

    plain, bonus = asyncio.run(main())
    assert plain.score == 3.0  # len("abc")
    assert bonus.score == 13.0  # len("abc") + 10


def test_raising_and_bad_values_score_zero_and_are_counted() -> None:
    async def main() -> tuple[list[RewardOutcome], AsyncRewardRunner]:
        outs = []
        for name in ("raising_reward_fn", "nan_reward_fn", "none_reward_fn"):
            async with AsyncRewardRunner(f"{FAKES}:{name}", max_workers=1, timeout_s=30) as r:
                outs.append(await r.ascore("p", "c", "a"))
                outs.append(await r.ascore("p", "c", "a"))  # the worker survives and answers again
                assert r.stats.calls == 2 and r.stats.errors == 2 and r.stats.timeouts == 0
                assert r.stats.worker_restarts == 0
        return outs, r

    outs, _ = asyncio.run(main())
    assert all(o.score == 0.0 and not o.timed_out for o in outs)
    assert "ValueError: cannot score 'c'" in (outs[0].error or "")
    assert "nan" in (outs[2].error or "")
    assert "not a float" in (outs[4].error or "")


def test_a_hanging_reward_times_out_without_eating_a_slot() -> None:
    async def main() -> tuple[list[RewardOutcome], float, AsyncRewardRunner, list[int]]:
        r = AsyncRewardRunner(f"{FAKES}:hanging_reward_fn", max_workers=2, timeout_s=1.0)
        await asyncio.gather(r.ascore("p", "warm", "a"), r.ascore("p", "warm", "a"))  # start both workers
        before = _worker_pids(r)
        t0 = time.monotonic()
        # Two hangs and two normal calls on two workers: each hang costs its worker, never both slots
        # for good, and the normal calls are not touched by the kill.
        outs = await asyncio.gather(*(r.ascore("p", c, "a") for c in ("hang", "ok", "hang", "ok")))
        elapsed = time.monotonic() - t0
        # After the hangs the pool has two live workers again and scores normally.
        after = [await r.ascore("p", "ok", "a") for _ in range(3)]
        r.close()
        return outs + after, elapsed, r, before

    outs, elapsed, r, before = asyncio.run(main())
    assert [o.timed_out for o in outs[:4]] == [True, False, True, False]
    assert [o.score for o in outs] == [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert r.stats.timeouts == 2 and r.stats.errors == 0 and r.stats.calls == 9
    assert r.stats.worker_restarts == 2
    assert elapsed < 20  # two 1 s timeouts (+ restarts), not an hour of sleep
    assert not any(_alive(pid) for pid in before)  # the hung workers were killed, not leaked


def test_a_dying_worker_is_replaced_and_the_call_is_an_infrastructure_failure() -> None:
    async def main() -> tuple[list[RewardOutcome], AsyncRewardRunner]:
        async with AsyncRewardRunner(f"{FAKES}:dying_reward_fn", max_workers=1, timeout_s=30) as r:
            return [await r.ascore("p", c, "a") for c in ("die", "ok", "die", "ok")], r

    outs, r = asyncio.run(main())
    assert [o.score for o in outs] == [0.0, 1.0, 0.0, 1.0]
    assert [o.infra_error for o in outs] == [True, False, True, False]  # not a judgement of "die"
    assert "exit code 3" in (outs[0].error or "")
    # Each "die" is tried twice (infra_retries=1), killing two workers.
    assert r.stats.errors == 2 and r.stats.worker_restarts == 4
    assert r.stats.infra_retries == 2 and r.stats.infra_failures == 2


def test_a_call_whose_worker_dies_once_is_retried_on_a_fresh_worker(tmp_path: Path) -> None:
    async def main() -> tuple[RewardOutcome, AsyncRewardRunner]:
        async with AsyncRewardRunner(f"{FAKES}:dies_once_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore("p", "c", "a", marker=str(tmp_path / "died")), r

    out, r = asyncio.run(main())
    assert out == RewardOutcome(1.0)  # the retry's real score, not a 0 for the crash
    assert r.stats.infra_retries == 1 and r.stats.worker_restarts == 1 and r.stats.errors == 0


@pytest.mark.parametrize("value", ["1e39", "1e308", "inf", "-inf", "nan", "-1e7"])
def test_unbounded_rewards_are_refused_at_the_worker(value: str) -> None:
    async def main() -> RewardOutcome:
        async with AsyncRewardRunner(f"{FAKES}:huge_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore("p", value, "a")

    out = asyncio.run(main())
    assert out.score == 0.0 and not out.infra_error
    assert "|reward| <= 1e+06" in (out.error or "")


@pytest.mark.parametrize(("fn", "value"), [("huge_reward_fn", "0.5"), ("huge_reward_fn", "-1e6")])
def test_bounded_rewards_pass(fn: str, value: str) -> None:
    async def main() -> RewardOutcome:
        async with AsyncRewardRunner(f"{FAKES}:{fn}", max_workers=1, timeout_s=30) as r:
            return await r.ascore("p", value, "a")

    assert asyncio.run(main()) == RewardOutcome(float(value))


def test_a_string_reward_is_refused_not_converted() -> None:
    async def main() -> RewardOutcome:
        async with AsyncRewardRunner(f"{FAKES}:string_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore("p", "c", "a")

    out = asyncio.run(main())
    assert out.score == 0.0 and "'1.0' (str), not a float" in (out.error or "")


def test_calls_run_in_parallel_up_to_max_workers() -> None:
    async def main() -> float:
        async with AsyncRewardRunner(f"{FAKES}:sleepy_reward_fn", max_workers=2, timeout_s=30) as r:
            await asyncio.gather(r.ascore("p", "c", "a", sleep_s=0), r.ascore("p", "c", "a", sleep_s=0))
            t0 = time.monotonic()
            outs = await asyncio.gather(*(r.ascore("p", "c", "a", sleep_s=0.5) for _ in range(4)))
            assert all(o.score == 1.0 for o in outs)
            return time.monotonic() - t0

    # 4 calls of 0.5 s on 2 workers: 2 rounds = 1.0 s; serial would be 2.0 s, unbounded 0.5 s.
    elapsed = asyncio.run(main())
    assert 0.95 <= elapsed < 1.9


def test_the_timeout_does_not_count_the_wait_for_a_free_worker() -> None:
    async def main() -> list[RewardOutcome]:
        async with AsyncRewardRunner(f"{FAKES}:sleepy_reward_fn", max_workers=1, timeout_s=1.5) as r:
            await r.ascore("p", "c", "a", sleep_s=0)
            # Three 0.6 s calls queue on one worker: the last finishes at 1.8 s > timeout, yet each
            # call ran for 0.6 s only.
            return await asyncio.gather(*(r.ascore("p", "c", "a", sleep_s=0.6) for _ in range(3)))

    assert [o.timed_out for o in asyncio.run(main())] == [False, False, False]


def test_unencodable_data_is_sent_as_text() -> None:
    async def main() -> RewardOutcome:
        async with AsyncRewardRunner(f"{FAKES}:echo_len_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore("p", "abc", "x", when=object())

    assert asyncio.run(main()).score == 3.0


def test_cancelling_a_call_replaces_its_worker() -> None:
    async def main() -> tuple[RewardOutcome, AsyncRewardRunner, int]:
        async with AsyncRewardRunner(f"{FAKES}:sleepy_reward_fn", max_workers=1, timeout_s=30) as r:
            await r.ascore("p", "c", "a", sleep_s=0)
            pid = _worker_pids(r)[0]
            task = asyncio.ensure_future(r.ascore("p", "c", "a", sleep_s=5))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The next call must not read the cancelled call's late reply.
            return await r.ascore("p", "c", "a", sleep_s=0), r, pid

    out, r, pid = asyncio.run(main())
    assert out == RewardOutcome(1.0, None, False)
    assert r.stats.worker_restarts == 1
    assert not _alive(pid)


def test_close_stops_the_workers_and_is_idempotent() -> None:
    async def main() -> tuple[AsyncRewardRunner, list[int]]:
        r = AsyncRewardRunner(f"{FAKES}:pid_reward_fn", max_workers=2, timeout_s=30)
        outs = await asyncio.gather(r.ascore("p", "c", "a"), r.ascore("p", "c", "a"))
        pids = _worker_pids(r)
        assert sorted(int(o.score) for o in outs) == sorted(pids)  # the calls ran in the workers
        r.close()
        r.close()
        return r, pids

    r, pids = asyncio.run(main())
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="after close"):
        asyncio.run(r.ascore("p", "c", "a"))


def test_the_runner_survives_a_new_event_loop() -> None:
    r = AsyncRewardRunner(synthetic_reward_fn, max_workers=1, timeout_s=30)
    try:
        assert asyncio.run(r.ascore("p", "5", "5")).score == 1.0
        assert asyncio.run(r.ascore("p", "5", "6")).score == 0.0
    finally:
        r.close()


def test_a_function_that_fails_to_import_in_the_worker_is_counted() -> None:
    async def main() -> RewardOutcome:
        async with AsyncRewardRunner(synthetic_reward_fn, max_workers=1, timeout_s=30) as r:
            r.fn_name = "rollflow.rewards.synthetic:no_such_fn"  # as if the module changed under us
            return await r.ascore("p", "c", "a")

    out = asyncio.run(main())
    assert out.score == 0.0 and "cannot import reward function" in (out.error or "")
    assert out.infra_error  # no worker could answer: not a score for the completion


def _local_reward(prompt: str, completion: str, answer: str) -> float:
    return 1.0


def test_functions_that_cannot_be_imported_by_name_are_refused() -> None:
    with pytest.raises(WorkflowImportError, match="cannot be imported by name"):
        AsyncRewardRunner(lambda p, c, a: 1.0)

    def nested(prompt: str, completion: str, answer: str) -> float:
        return 1.0

    with pytest.raises(WorkflowImportError, match="cannot be imported by name"):
        AsyncRewardRunner(nested)
    with pytest.raises(WorkflowImportError, match="cannot import module"):
        AsyncRewardRunner("no_such_module_xyz:fn")
    with pytest.raises(WorkflowImportError, match="has no attribute"):
        AsyncRewardRunner("rollflow.rewards.synthetic:nope")
    with pytest.raises(WorkflowImportError, match="not an import string"):
        AsyncRewardRunner("synthetic_reward_fn")
    assert reward_fn_name(_local_reward).endswith("test_runner:_local_reward")
    assert reward_fn_name("rollflow.rewards.synthetic.synthetic_reward_fn") == (
        "rollflow.rewards.synthetic:synthetic_reward_fn"
    )


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        AsyncRewardRunner(synthetic_reward_fn, max_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        AsyncRewardRunner(synthetic_reward_fn, timeout_s=0)


def test_ascore_many_scores_a_group_in_order_on_one_worker() -> None:
    async def main() -> tuple[list[RewardOutcome], list[RewardOutcome], AsyncRewardRunner]:
        async with (
            AsyncRewardRunner(f"{FAKES}:echo_len_reward_fn", max_workers=2, timeout_s=30) as r,
            AsyncRewardRunner(f"{FAKES}:pid_reward_fn", max_workers=2, timeout_s=30) as pid,
        ):
            group = await r.ascore_many("p", ["a", "bbb", "cc", "", "dddd"], "x", bonus=10)
            pids = await pid.ascore_many("p", ["1", "2", "3"], "x")
            return group, pids, r

    group, pids, r = asyncio.run(main())
    assert [o.score for o in group] == [11.0, 13.0, 12.0, 10.0, 14.0]
    assert r.stats.calls == 5 and r.stats.errors == 0
    assert len({o.score for o in pids}) == 1  # one worker answered the whole batch


def test_ascore_many_a_hang_or_death_mid_batch_costs_only_that_call() -> None:
    async def main() -> tuple[list[RewardOutcome], list[RewardOutcome], AsyncRewardRunner, AsyncRewardRunner]:
        async with (
            AsyncRewardRunner(f"{FAKES}:hanging_reward_fn", max_workers=1, timeout_s=1.0) as hang,
            AsyncRewardRunner(f"{FAKES}:dying_reward_fn", max_workers=1, timeout_s=30) as die,
        ):
            hung = await hang.ascore_many("p", ["ok", "hang", "ok", "ok"], "a")
            died = await die.ascore_many("p", ["ok", "die", "ok", "die", "ok"], "a")
            return hung, died, hang, die

    hung, died, hang, die = asyncio.run(main())
    assert [o.timed_out for o in hung] == [False, True, False, False]
    assert [o.score for o in hung] == [1.0, 0.0, 1.0, 1.0]  # the calls queued behind the hang were re-sent
    assert hang.stats.calls == 4 and hang.stats.timeouts == 1 and hang.stats.worker_restarts == 1
    assert [o.score for o in died] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [o.infra_error for o in died] == [False, True, False, True, False]  # never a reward of 0
    assert "exit code 3" in (died[1].error or "") and "exit code 3" in (died[3].error or "")
    # each "die" killed its worker, was retried once on a fresh one (infra_retries=1) and killed that too
    assert die.stats.calls == 5 and die.stats.infra_failures == 2 and die.stats.infra_retries == 2
    assert die.stats.worker_restarts == 4


def test_ascore_many_larger_than_the_pipe_buffer_is_sent_call_by_call() -> None:
    big = "x" * (40 << 10)  # two of these exceed one pipe write's budget

    async def main() -> list[RewardOutcome]:
        async with AsyncRewardRunner(f"{FAKES}:echo_len_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore_many("p", [big, big, "c"], "x")

    assert [o.score for o in asyncio.run(main())] == [float(len(big)), float(len(big)), 1.0]


def test_a_batch_whose_worker_dies_once_gets_every_real_score(tmp_path: Path) -> None:
    async def main() -> tuple[list[RewardOutcome], AsyncRewardRunner]:
        async with AsyncRewardRunner(f"{FAKES}:dies_once_reward_fn", max_workers=1, timeout_s=30) as r:
            return await r.ascore_many("p", ["a", "b", "c"], "x", marker=str(tmp_path / "died")), r

    outs, r = asyncio.run(main())
    assert outs == [RewardOutcome(1.0)] * 3  # the crash cost a retry, not a score
    assert r.stats.infra_retries == 1 and r.stats.infra_failures == 0 and r.stats.calls == 3
