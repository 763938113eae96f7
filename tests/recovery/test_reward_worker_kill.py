"""SIGKILL of a reward worker from outside, in the middle of a call (``AsyncRewardRunner`` with real
worker processes): the call is sent again to a fresh worker and gets its real score, nothing else
is touched. (A second death of the same call is an infrastructure failure and its group is dropped,
not trained on 0: ``tests/rewards/test_runner.py`` and ``tests/rollout/test_workflows.py``.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from rollflow.rewards import AsyncRewardRunner, RewardOutcome

FAKES = "recovery_fakes"  # tests/recovery/recovery_fakes.py, on the workers' sys.path (the parent's)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie still answers kill(0)
        return f.read().split(")")[-1].split()[0] != "Z"


def test_a_reward_worker_killed_mid_call_is_replaced_and_the_call_scored() -> None:
    async def main() -> tuple[list[RewardOutcome], float, Any, int]:
        async with AsyncRewardRunner(f"{FAKES}:slow_reward_fn", max_workers=2, timeout_s=30) as r:
            await asyncio.gather(r.ascore("p", "0", "a"), r.ascore("p", "0", "a"))  # both workers up
            calls = [asyncio.create_task(r.ascore("p", "1.0", "a")) for _ in range(2)]
            await asyncio.sleep(0.3)  # both calls are sleeping in their workers
            victim = r._workers[0].process.pid
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            outs = list(await asyncio.gather(*calls))
            return outs, time.monotonic() - t0, r, victim

    outs, answered_s, r, victim = asyncio.run(main())
    assert outs == [RewardOutcome(1.0), RewardOutcome(1.0)]  # the killed call's retry scored for real
    assert r.stats.worker_restarts == 1 and r.stats.infra_retries == 1
    assert r.stats.infra_failures == 0 and r.stats.errors == 0 and r.stats.timeouts == 0
    assert not _alive(victim)
    # answered_s = a fresh worker's start (it imports the reward module) + the retried 1.0 s call
    assert answered_s < 30
    print(f"killed call answered {answered_s:.2f} s after the SIGKILL (1.0 s of it the call itself)")
