"""WorkflowExecutor with a 10-line fake client: capacity, staleness, failures, filters, writer, collected groups.

The integration with the real CPU inference server is in test_loop.py.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from rollflow.api.errors import RolloutFailureError
from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.staleness import StalenessManager
from storage.schema import TrajectoryGroup, TrajectoryRow


class FakeClient:
    """Two output tokens stamped with the current version, after ``delay`` seconds."""

    def __init__(self, delay: float = 0.005) -> None:
        self.version, self.delay = 0, delay

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        v = self.version
        await asyncio.sleep(self.delay)
        return GenerateResult(req.rid or "r", req.input_ids, [7, 8], [-0.5, -0.25], [v, v], "stop")

    def get_version(self) -> int:
        return self.version


class EchoWorkflow(RolloutWorkflow):
    """One row per episode; ``data`` may ask it to raise, return None, sleep or wait for a version."""

    def __init__(self) -> None:
        self.running = 0
        self.max_running = 0

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if data.get("raise"):
                raise ValueError(f"bad row {data['i']}")
            if data.get("none"):
                return None
            res = await client.agenerate(GenerateRequest([1, 2, 3]))
            if "gate" in data:
                await data["gate"].wait()
            while client.get_version() < data.get("finish_at_version", 0):
                await asyncio.sleep(0.005)
            await asyncio.sleep(data.get("sleep", 0.0))
            gid = uuid.uuid4().hex
            row = TrajectoryRow.build(
                traj_id=gid + "-0",
                group_id=gid,
                prompt_id=str(data["i"]),
                input_ids=res.input_ids + res.output_ids,
                loss_mask=[0, 0, 0, 1, 1],
                logprobs=[0.0, 0.0, 0.0, *res.output_logprobs],
                versions=[-1, -1, -1, *res.output_versions],
                reward=float(data.get("reward", 1.0)),
                finish_reason=res.finish_reason,
            )
            return TrajectoryGroup(gid, str(data["i"]), [row])
        finally:
            self.running -= 1


class ListWriter:
    """In-memory stand-in for ShardWriter: commits every ``every`` adds, or on flush."""

    def __init__(self, every: int = 3) -> None:
        self.buffer: list[TrajectoryGroup] = []
        self.committed: list[TrajectoryGroup] = []
        self.every = every
        self.flush_rows = every  # the ShardSink contract (its records do not count rows)

    def add(self, group: TrajectoryGroup) -> str | None:
        self.buffer.append(group)
        return self.flush() if len(self.buffer) >= self.every else None

    def maybe_flush(self) -> str | None:
        return None

    def flush(self) -> str | None:
        if not self.buffer:
            return None
        self.committed += self.buffer
        self.buffer = []
        return "record"


def _executor(
    client: FakeClient, *, max_concurrent: int = 4, staleness: int = 100, batch: int = 1, **kw: Any
) -> tuple[WorkflowExecutor, EchoWorkflow, StalenessManager]:
    wf = EchoWorkflow()
    sm = StalenessManager(max_concurrent, staleness, batch)
    return WorkflowExecutor(wf, client, sm, poll_interval_s=0.01, **kw), wf, sm


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


def test_rollout_batch_returns_accepted_groups_in_order_and_bounds_concurrency() -> None:
    async def main() -> None:
        ex, wf, sm = _executor(FakeClient(), max_concurrent=3)
        async with ex:
            groups = await ex.arollout_batch([{"i": i} for i in range(10)])
        assert [g.prompt_id for g in groups] == [str(i) for i in range(10)]
        assert wf.max_running == 3  # max_concurrent = 3
        assert sm.stat.accepted == 10 and sm.stat.running == 0
        assert ex.stats.tokens == 20  # 10 groups x 2 generated tokens

    asyncio.run(main())


def test_staleness_bound_stops_admission_until_the_version_moves() -> None:
    async def main() -> None:
        client = FakeClient()
        ex, _, sm = _executor(client, max_concurrent=10, staleness=1, batch=2)
        async with ex:
            ex.feed_rows(iter({"i": i} for i in range(20)))
            # version 0: (1 + 0 + 1) * 2 = 4 groups may exist
            await _until(lambda: sm.stat.accepted == 4)
            await asyncio.sleep(0.05)
            assert ex.stats.started == 4
            client.version = 1  # (1 + 1 + 1) * 2 = 6
            await _until(lambda: sm.stat.accepted == 6)
            await asyncio.sleep(0.05)
            assert ex.stats.started == 6
            client.version = 9  # (1 + 9 + 1) * 2 = 22 > 20 rows: everything runs
            await ex.await_idle()
        assert sm.stat.accepted == 20

    asyncio.run(main())


def test_stale_group_is_rejected_when_the_trainer_moved_past_its_bound() -> None:
    async def main() -> None:
        client = FakeClient()
        ex, _, sm = _executor(client, staleness=1, batch=100)
        async with ex:
            fut = await ex.asubmit({"i": 0, "finish_at_version": 3})  # tokens at v0, finishes at v3
            await asyncio.sleep(0.02)
            client.version = 3
            assert await fut is None  # head 0 < 3 - 1
            ok = await ex.asubmit({"i": 1, "finish_at_version": 3})  # head 3 >= 3 - 1
            assert await ok is not None
        assert ex.stats.rejected == {"stale": 1}
        assert sm.stat.accepted == 1 and sm.stat.rejected == 1

    asyncio.run(main())


def test_stale_check_uses_the_queue_position_when_episodes_overtake() -> None:
    """G starts at v0, 5 later groups overtake it; the oldest-first trainer would eat G at version 2."""

    async def main() -> None:
        client = FakeClient()
        ex, _, sm = _executor(client, max_concurrent=10, staleness=1, batch=2)
        gate = asyncio.Event()
        async with ex:
            # version 0: capacity (1 + 0 + 1) * 2 = 4 -> G, H1, H2, H3 start
            g = await ex.asubmit({"i": "G", "gate": gate})
            early = [await ex.asubmit({"i": f"H{j}"}) for j in (1, 2, 3)]
            assert all(await asyncio.gather(*early))
            client.version = 1  # the trainer ate H1, H2; capacity (1 + 1 + 1) * 2 - (3 + 1) = 2
            late = [await ex.asubmit({"i": f"H{j}"}) for j in (4, 5)]
            assert all(await asyncio.gather(*late))
            gate.set()
            # version check alone passes (head 0 >= 1 - 1), but G is queued 6th: consumed at 5 // 2 = 2,
            # and 0 < 2 - 1 -> stale
            assert await g is None
        assert ex.stats.rejected == {"stale": 1}
        assert sm.stat.accepted == 5

    asyncio.run(main())


def test_raising_workflow_is_counted_and_the_loop_goes_on() -> None:
    async def main() -> None:
        ex, _, sm = _executor(FakeClient(), max_failure_rate=0.5, min_episodes_for_failure=4)
        rows = [{"i": i, "raise": i % 4 == 0} for i in range(12)]  # 3 of 12 raise: 25 % < 50 %
        async with ex:
            groups = await ex.arollout_batch(rows)
        assert len(groups) == 9
        assert ex.stats.failed == 3 and sm.stat.rejected == 3
        assert "ValueError: bad row 0" in (ex.stats.first_failure or "")

    asyncio.run(main())


def test_failure_rate_above_threshold_stops_with_first_traceback() -> None:
    async def main() -> None:
        ex, _, _ = _executor(FakeClient(), max_failure_rate=0.2, min_episodes_for_failure=5)
        async with ex:
            ex.feed_rows(iter({"i": i, "raise": True} for i in range(50)))
            with pytest.raises(RolloutFailureError) as info:
                await ex.await_idle()
        msg = str(info.value)
        assert "> rollout.max_failure_rate=20%" in msg
        assert "Traceback" in msg and "arun_episode" in msg and "ValueError: bad row 0" in msg
        assert ex.stats.failed >= 5 and ex.stats.started < 50

    asyncio.run(main())


class GatedWorkflow(RolloutWorkflow):
    """Waits for ``data["gate"]``, then at once raises (``data["raise_late"]``) or returns a group, so
    every episode the gate releases finishes in the same scheduler tick."""

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        await data["gate"].wait()
        if data.get("raise_late"):
            raise ValueError(f"late failure {data['i']}")
        gid = uuid.uuid4().hex
        row = TrajectoryRow.build(
            traj_id=gid + "-0", group_id=gid, prompt_id=str(data["i"]), input_ids=[1, 2, 7],
            loss_mask=[0, 0, 1], logprobs=[0.0, 0.0, -0.5], versions=[-1, -1, 0], reward=1.0,
            finish_reason="stop",
        )  # fmt: skip
        return TrajectoryGroup(gid, str(data["i"]), [row])


def test_episodes_finishing_with_the_fatal_failure_are_all_judged() -> None:
    """10 episodes finish in one tick, the first 8 (by start) raising: the failure rate is over the bound
    after the 5th, yet all 10 are judged (8 failed, 2 accepted) and none is counted as cancelled."""

    async def main() -> None:
        sm = StalenessManager(10, 100, 1)
        ex = WorkflowExecutor(
            GatedWorkflow(), FakeClient(), sm, poll_interval_s=0.01,
            max_failure_rate=0.2, min_episodes_for_failure=5,
        )  # fmt: skip
        gate = asyncio.Event()
        async with ex:
            futures = [await ex.asubmit({"i": i, "gate": gate, "raise_late": i < 8}) for i in range(10)]
            await _until(lambda: ex.n_running == 10)
            gate.set()
            with pytest.raises(RolloutFailureError, match="8 of 10 rollout episodes raised"):
                await ex.await_idle()
            results = await asyncio.gather(*futures, return_exceptions=True)
        assert ex.stats.failed == 8 and ex.stats.accepted == 2 and ex.stats.cancelled == 0
        assert sum(isinstance(r, TrajectoryGroup) for r in results) == 2
        assert sm.stat.running == 0

    asyncio.run(main())


def test_none_and_filtered_groups_are_rejected() -> None:
    async def main() -> None:
        ex, _, sm = _executor(FakeClient(), should_accept_fn=lambda g: g.rows[0].reward > 0)
        rows = [{"i": 0, "none": True}, {"i": 1, "reward": 0.0}, {"i": 2, "reward": 1.0}]
        async with ex:
            groups = await ex.arollout_batch(rows)
        assert [g.prompt_id for g in groups] == ["2"]
        assert ex.stats.rejected == {"none": 1, "filtered": 1}
        assert sm.stat.accepted == 1 and sm.stat.rejected == 2

    asyncio.run(main())


def test_should_accept_fn_as_import_string() -> None:
    ex, _, _ = _executor(FakeClient(), should_accept_fn="builtins:bool")
    assert ex._should_accept is bool


def test_writer_receives_groups_and_on_flush_sees_only_uncommitted_keys() -> None:
    snapshots: list[tuple[int, list[Any]]] = []

    async def main() -> None:
        writer = ListWriter(every=3)
        ex, _, _ = _executor(
            FakeClient(),
            max_concurrent=2,
            writer=writer,
            on_flush=lambda e: snapshots.append((len(writer.committed), sorted(e.open_keys()))),
        )
        async with ex:
            ex.feed(iter((f"k{i}", {"i": i}) for i in range(7)))
            await ex.await_idle()
            # two full shards; then nothing runs and the source is exhausted, so the last group is
            # committed at once (the gate), not left to the writer's timer
            await _until(lambda: len(writer.committed) == 7 and ex.open_keys() == [])
        assert ex.stats.flushes == 3 and ex.stats.flush_causes == {"fill": 2, "gate": 1}
        for n_committed, open_keys in snapshots:
            # nothing committed is reported open
            assert not {g.prompt_id for g in writer.committed[:n_committed]} & {k[1:] for k in open_keys}

    asyncio.run(main())


def test_pause_blocks_admission_until_resume() -> None:
    async def main() -> None:
        ex, _, _ = _executor(FakeClient())
        async with ex:
            ex.pause()
            fut = await ex.asubmit({"i": 0})
            await asyncio.sleep(0.05)
            assert ex.stats.started == 0 and ex.paused
            ex.resume()
            assert await fut is not None

    asyncio.run(main())


def test_close_cancels_running_episodes() -> None:
    async def main() -> None:
        ex, _, sm = _executor(FakeClient())
        async with ex:
            ex.feed_rows(iter({"i": i, "sleep": 10.0} for i in range(3)))
            await _until(lambda: ex.n_running == 3)
        assert ex.stats.cancelled == 3 and sm.stat.running == 0

    asyncio.run(main())


def test_untracked_submits_are_collected_oldest_first_for_await_results() -> None:
    async def main() -> None:
        ex, _, _ = _executor(FakeClient(), max_concurrent=2)
        async with ex:
            for i in range(3):
                assert await ex.asubmit({"i": i}, track=False) is None
            got = await ex.await_results(3, timeout=10)
            assert sorted(g.prompt_id for g in got) == ["0", "1", "2"]
            with pytest.raises(TimeoutError):
                await ex.await_results(1, timeout=0.1)

    asyncio.run(main())
