"""ZeroVarianceSkip alone, and in the WorkflowExecutor: prompts whose last group had all-equal rewards are
not generated again (most of the time), are released like rejected groups, and the rest run as before."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.prompt_filter import ZeroVarianceSkip
from rollflow.rollout.staleness import StalenessManager
from storage.schema import TrajectoryGroup, TrajectoryRow


def test_only_flat_prompts_are_skipped_and_unseen_ones_never() -> None:
    f = ZeroVarianceSkip(0.5, seed=1)
    f.observe("flat", [1.0, 1.0, 1.0])
    f.observe("signal", [0.0, 1.0, 1.0])
    assert not any(f.skip("signal") for _ in range(200))
    assert not any(f.skip("unseen") for _ in range(200))
    n = sum(f.skip("flat") for _ in range(2000))
    assert 850 < n < 1150 and f.skipped == n  # about half, seeded
    f.observe("flat", [0.0, 1.0])  # revisited and now learning: never skipped
    assert not any(f.skip("flat") for _ in range(200))
    assert f.metrics()["prompt_filter/flat_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="never revisit"):
        ZeroVarianceSkip(1.0)


class FakeClient:
    """Two output tokens at version 0."""

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0.001)
        return GenerateResult(req.rid or "r", req.input_ids, [7, 8], [-0.5, -0.25], [0, 0], "stop")

    def get_version(self) -> int:
        return 0


class PairWorkflow(RolloutWorkflow):
    """Two samples per prompt with the rewards the row names; counts what it generated."""

    def __init__(self) -> None:
        self.generated: list[str] = []

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup:
        self.generated.append(data["prompt_id"])
        gid, rows = uuid.uuid4().hex, []
        for j, reward in enumerate(data["rewards"]):
            res = await client.agenerate(GenerateRequest([1, 2, 3]))
            rows.append(
                TrajectoryRow.build(
                    traj_id=f"{gid}-{j}",
                    group_id=gid,
                    prompt_id=data["prompt_id"],
                    input_ids=res.input_ids + res.output_ids,
                    loss_mask=[0, 0, 0, 1, 1],
                    logprobs=[0.0, 0.0, 0.0, *res.output_logprobs],
                    versions=[-1, -1, -1, *res.output_versions],
                    reward=reward,
                    finish_reason=res.finish_reason,
                )
            )
        return TrajectoryGroup(gid, data["prompt_id"], rows)


def test_executor_does_not_generate_flat_prompts_of_a_later_epoch() -> None:
    rows = [{"prompt_id": f"p{i}", "rewards": [1.0, 1.0] if i % 2 else [0.0, 1.0]} for i in range(20)]

    async def main() -> tuple[PairWorkflow, WorkflowExecutor, StalenessManager]:
        wf, sm = PairWorkflow(), StalenessManager(4, 100, 1)
        ex = WorkflowExecutor(
            wf, FakeClient(), sm, poll_interval_s=0.01, prompt_filter=ZeroVarianceSkip(0.99)
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
