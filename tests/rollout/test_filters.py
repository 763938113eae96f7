"""Dynamic sampling: the built-in reward-variance filter, its composition with a user filter, and its cost."""

from __future__ import annotations

import asyncio
from typing import Any

from test_executor import EchoWorkflow, FakeClient

from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.filters import CappedVarianceFilter, build_should_accept, reward_variance_filter
from rollflow.rollout.staleness import StalenessManager
from storage.schema import TrajectoryGroup, TrajectoryRow


def _group(rewards: list[float]) -> TrajectoryGroup:
    rows = [
        TrajectoryRow.build(
            traj_id=f"g-{i}", group_id="g", prompt_id="p", input_ids=[1, 2, 3], loss_mask=[0, 1, 1],
            logprobs=[0.0, -0.1, -0.2], versions=[-1, 0, 0], reward=r, finish_reason="stop",
        )
        for i, r in enumerate(rewards)
    ]  # fmt: skip
    return TrajectoryGroup("g", "p", rows)


def test_reward_variance_filter_keeps_only_groups_with_signal() -> None:
    assert reward_variance_filter(_group([0.0, 1.0, 0.0, 0.0]))
    assert not reward_variance_filter(_group([0.0] * 8))  # all wrong: every advantage is 0
    assert not reward_variance_filter(_group([1.0] * 8))  # all right
    assert not reward_variance_filter(_group([0.5]))  # one sample has no baseline
    assert not reward_variance_filter(_group([0.3, 0.3 + 1e-8]))  # float jitter is no signal
    assert reward_variance_filter(_group([0.3, 0.31]))


def test_build_should_accept_composes_filters_in_order() -> None:
    assert build_should_accept(False, None) is None
    plain = build_should_accept(True, None)
    assert isinstance(plain, CappedVarianceFilter) and plain.max_extra is None
    assert build_should_accept(False, "builtins:bool") is bool
    seen: list[list[float]] = []

    def user(group: TrajectoryGroup) -> bool:
        seen.append(group.rewards)
        return group.rewards[0] > 0

    both = build_should_accept(True, user)
    assert both is not None
    assert not both(_group([1.0, 1.0]))  # the variance filter says no: the user's fn never runs
    assert seen == []
    assert both(_group([1.0, 0.0])) and not both(_group([0.0, 1.0]))
    assert seen == [[1.0, 0.0], [0.0, 1.0]]


class PairWorkflow(EchoWorkflow):
    """Two rows per episode, rewards from ``data["rewards"]``."""

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        one = await super().arun_episode(client, {"i": data["i"], "reward": data["rewards"][0]})
        assert one is not None
        second = one.rows[0].__class__.build(
            traj_id=one.rows[0].traj_id + "b", group_id=one.group_id, prompt_id=one.prompt_id,
            input_ids=list(one.rows[0].input_ids), loss_mask=list(one.rows[0].loss_mask),
            logprobs=list(one.rows[0].logprobs), versions=list(one.rows[0].versions),
            reward=data["rewards"][1], finish_reason="stop",
        )  # fmt: skip
        return TrajectoryGroup(one.group_id, one.prompt_id, [one.rows[0], second])


def test_executor_drops_groups_without_signal_and_counts_their_generation() -> None:
    async def main() -> None:
        sm = StalenessManager(4, 100, 1)
        ex = WorkflowExecutor(
            PairWorkflow(), FakeClient(), sm, poll_interval_s=0.01,
            should_accept_fn=build_should_accept(True, None),
        )  # fmt: skip
        rows = [
            {"i": 0, "rewards": [0.0, 0.0]},
            {"i": 1, "rewards": [1.0, 0.0]},
            {"i": 2, "rewards": [1.0, 1.0]},
        ]
        async with ex:
            groups = await ex.arollout_batch(rows)
        assert [g.prompt_id for g in groups] == ["1"]
        assert ex.stats.rejected == {"filtered": 2}
        m = ex.stats.as_metrics()
        assert m["completions_generated"] == 6.0  # 3 groups x 2 rows: the filtered ones cost too
        assert m["rejected_filtered"] == 2.0 and m["groups_accepted"] == 1.0
        assert m["busy_s"] > 0.0 and ex.stats.busy_since is None  # idle again after the batch

    asyncio.run(main())


def test_the_cap_bounds_the_groups_dropped_per_group_kept() -> None:
    flat, signal = _group([0.0] * 4), _group([0.0, 1.0, 0.0, 0.0])
    uncapped = CappedVarianceFilter(None)
    assert not any(uncapped(flat) for _ in range(50))  # no cap: drops every group without signal
    capped = CappedVarianceFilter(1.0)
    kept = [capped(g) for g in [flat, flat, signal, flat, flat, flat, flat, flat]]
    # dropped <= 1 x (kept + 1) after every call: a flat group is kept whenever dropping it would break it.
    assert kept == [False, True, True, False, False, True, False, True]
    assert capped.dropped <= 1.0 * capped.kept + 1
    zero = CappedVarianceFilter(0.0)  # a cap of 0 keeps everything: plain sampling
    assert all(zero(flat) for _ in range(5))
