"""A config that names only the task runs at full speed: no training step waits for the shard timer.

The interlock this guards against: with ``max_staleness`` S and ``train.batch_size`` B the rollout may run
at most ``(S + 1) * B`` groups ahead of the trainer. When the shard size is larger than what fits in that
window (256 rows = 1 x 16 x 8 with the old fixed default), a shard never fills: the rollout stops at the
bound with its groups in the writer's buffer, the trainer waits for them, and only the flush timer breaks
the tie, once per step. Here the timer is set to 10^6 s, so a run that relies on it makes no step at all;
the real ``ShardWriter`` on a local trial commits, a stand-in trainer moves the version one step per
committed batch, and the flushes are counted by cause (``ExecutorStats.flush_causes``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from rollflow.api.config import ExperimentConfig
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.staleness import StalenessManager
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter

STEPS = 6


class Versioned:
    """The served version, moved by the stand-in trainer."""

    def __init__(self) -> None:
        self.version = 0

    def get_version(self) -> int:
        return self.version


class GroupWorkflow(RolloutWorkflow):
    """``size`` rows per episode, stamped with the served version, after a short sleep."""

    def __init__(self, size: int) -> None:
        self.size = size

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        v = client.get_version()
        await asyncio.sleep(0.001)
        gid = uuid.uuid4().hex
        rows = [
            TrajectoryRow.build(
                traj_id=f"{gid}-{i}",
                group_id=gid,
                prompt_id=str(data["i"]),
                input_ids=[1, 2, 3, 4],
                loss_mask=[0, 0, 1, 1],
                logprobs=[0.0, 0.0, -0.5, -0.5],
                versions=[-1, -1, v, v],
                reward=float(i % 2),
                finish_reason="stop",
            )  # fmt: skip
            for i in range(self.size)
        ]
        return TrajectoryGroup(gid, str(data["i"]), rows)


async def _train(cfg: ExperimentConfig, flush_rows: int, tmp_path: Path) -> tuple[int, dict[str, int]]:
    """Run the executor against a trainer that steps once per committed batch; return (steps, causes)."""
    rc, batch = cfg.rollout, cfg.train.batch_size
    client = Versioned()
    storage = Storage.open(str(tmp_path / "store"), "test", "interlock")
    writer = ShardWriter(storage, "rollout", flush_rows=flush_rows, flush_seconds=1e6)
    staleness = StalenessManager(rc.max_concurrent_rollouts, rc.max_staleness, batch)
    executor = WorkflowExecutor(GroupWorkflow(rc.group_size), client, staleness, writer=writer)
    async with executor:
        executor.feed_rows({"i": i} for i in range(10**6))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60.0  # a safety net only: without the fix no step is ever made
        while client.version < STEPS and loop.time() < deadline:
            if writer.stats["groups"] >= (client.version + 1) * batch:
                client.version += 1  # the trainer consumed a committed batch and published the next policy
            await asyncio.sleep(0.01)
    return client.version, dict(executor.stats.flush_causes)


@pytest.mark.parametrize("flush_rows", ["default", "never_fills"])
def test_a_config_that_names_only_the_task_never_waits_for_the_flush_timer(
    flush_rows: str, tmp_path: Path
) -> None:
    cfg = ExperimentConfig()  # every rollout, train and staleness default, as a user leaves them
    batch, rc = cfg.train.batch_size, cfg.rollout
    window_rows = (rc.max_staleness + 1) * batch * rc.group_size  # the most rows the bound lets ahead
    # The default shard is one training batch: it fits the window, so it fills.
    assert rc.shard_flush_rows is None and rc.flush_rows(batch) == batch * rc.group_size <= window_rows
    rows = rc.flush_rows(batch) if flush_rows == "default" else 10 * window_rows
    steps, causes = asyncio.run(_train(cfg, rows, tmp_path))
    assert steps == STEPS, f"the trainer made {steps} of {STEPS} steps; flushes by cause: {causes}"
    assert causes.get("timer", 0) == 0, causes  # no commit waited for the 10^6 s timer
    if flush_rows == "never_fills":
        # the gate committed what the bound let ahead: up to S + 1 batches at a time
        assert causes.get("gate", 0) >= STEPS // (rc.max_staleness + 1) and causes.get("fill", 0) == 0
    else:
        assert causes.get("fill", 0) >= STEPS  # one full shard per training batch
