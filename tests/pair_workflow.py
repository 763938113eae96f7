"""A stand-in rollout for executor tests: a client that returns two tokens at version 0, and a workflow
whose group rewards are the ones its row names (``row["rewards"]``), recording what it generated."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.api.workflow import RolloutWorkflow
from storage.schema import TrajectoryGroup, TrajectoryRow


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
