"""The rollout loop on real storage (local dir and moto S3): epochs, limits, done marker, restart
accounting, malformed rows, failing workflows. A 10-line fake client keeps most of these fast; the last
test runs the loop against the real CPU inference server, its checkpoint watcher and a slow fake trainer.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import DatasetRowError, RolloutFailureError
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.loop import run_rollout_loop
from rollflow.rollout.prompt_rows import check_row
from rollflow.rollout.prompt_source import ClaimedPrompts
from rollflow.workflows.factory import build_workflow
from rollflow.workflows.rlvr import RLVRWorkflow
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.prompt_claims import ClaimLog
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_reader import ShardReader


class FakeClient:
    def __init__(self) -> None:
        self.version = 0

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0.002)
        return GenerateResult(req.rid or "r", req.input_ids, [5], [-0.1], [self.version], "stop")

    def get_version(self) -> int:
        return self.version


class OneRowWorkflow(RolloutWorkflow):
    """One row per prompt; raises for rows that say so."""

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        if data.get("explode"):
            raise RuntimeError(f"exploded on {data['prompt_id']}")
        res = await client.agenerate(GenerateRequest([1, 2]))
        gid = uuid.uuid4().hex
        row = TrajectoryRow.build(
            traj_id=gid,
            group_id=gid,
            prompt_id=str(data["prompt_id"]),
            input_ids=[1, 2, *res.output_ids],
            loss_mask=[0, 0, 1],
            logprobs=[0.0, 0.0, *res.output_logprobs],
            versions=[-1, -1, *res.output_versions],
            reward=1.0,
            finish_reason="stop",
        )
        return TrajectoryGroup(gid, row.prompt_id, [row])


def _rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"prompt_id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}], "answer": "1", **extra}
        for i in range(n)
    ]


def _cfg(**rollout: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.train.batch_size = 4
    cfg.rollout.max_concurrent_rollouts = 3
    cfg.rollout.max_staleness = 100
    cfg.rollout.shard_flush_rows = 2
    cfg.rollout.shard_flush_seconds = 0.05
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


def _run(cfg: ExperimentConfig, storage: Storage, prompts: list[Any], **kw: Any) -> Any:
    kw.setdefault("workflow", OneRowWorkflow())
    client = kw.pop("client", FakeClient())
    return asyncio.run(
        run_rollout_loop(cfg, storage, client, prompts=prompts, poll_interval_s=0.02, done_poll_s=0.05, **kw)
    )


def _committed_prompts(storage: Storage) -> collections.Counter[str]:
    reader = ShardReader(storage)
    groups = reader.take(10_000).groups
    return collections.Counter(g.prompt_id for g in groups)


def test_claimed_prompts_are_a_seeded_permutation_per_epoch(storage: Storage) -> None:
    rows = _rows(5)
    src = ClaimedPrompts(
        rows, seed=3, max_epochs=2, claims=ClaimLog(storage), block_size=2, worker="w-1", name="w",
        fits=lambda reserved: True,
    )  # fmt: skip
    got = list(src)
    assert [p for p, _ in got] == list(range(10))  # global positions: epoch * 5 + position
    epoch0 = [r["prompt_id"] for p, r in got if p < 5]
    epoch1 = [r["prompt_id"] for p, r in got if p >= 5]
    assert sorted(epoch0) == sorted(epoch1) == [f"p{i}" for i in range(5)]
    assert epoch0 != epoch1  # a new permutation per epoch (seeded, so the same for every worker)
    assert src.claimed == 5 and src.exhausted  # blocks [0,2) [2,4) [4,6) [6,8) [8,10)


def test_loop_runs_max_epochs_and_writes_every_prompt_once_per_epoch(storage: Storage) -> None:
    summary = _run(_cfg(max_epochs=2), storage, _rows(5))
    assert summary.stopped_by == "epochs"
    assert summary.accepted == 10 and summary.total_accepted == 10
    assert _committed_prompts(storage) == {f"p{i}": 2 for i in range(5)}
    state = storage.get_json(keys.rollout_state_key("rollout"))
    assert (state["epoch"], state["position"], state["blocks"], state["accepted"]) == (2, 0, {}, 10)


def test_restart_continues_where_it_left_off(storage: Storage) -> None:
    """Stop at a group limit mid-epoch, restart: every prompt of the 2 epochs is committed exactly twice."""
    first = _run(_cfg(max_epochs=2, max_groups=4), storage, _rows(5))
    assert first.stopped_by == "limit" and first.total_accepted >= 4
    state = storage.get_json(keys.rollout_state_key("rollout"))
    assert state["accepted"] == first.total_accepted == ShardReader(storage).count_committed_groups()
    second = _run(_cfg(max_epochs=2), storage, _rows(5))
    assert second.stopped_by == "epochs"
    assert second.total_accepted == 10  # restored from storage + this run; no prompt lost or repeated
    assert _committed_prompts(storage) == {f"p{i}": 2 for i in range(5)}


def test_accepted_is_restored_from_storage_so_capacity_stays_closed(storage: Storage) -> None:
    """AReaL #1388: after a restart at version 0 with 4 groups on disk, (0 + 0 + 1) * 4 - 4 = 0 may start."""
    _run(_cfg(max_epochs=1, max_staleness=0), storage, _rows(4))
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    again = _run(_cfg(max_staleness=0), storage, _rows(4), stop_event=stop)
    assert again.stopped_by == "stop_event"
    assert again.accepted == 0 and again.total_accepted == 4
    assert ShardReader(storage).count_committed_groups() == 4


def test_done_marker_stops_the_loop(storage: Storage) -> None:
    CheckpointStore(storage).mark_done({"version": 3})
    summary = _run(_cfg(), storage, _rows(3))
    assert summary.stopped_by == "done"


def test_a_stop_event_after_the_trainer_finished_is_the_end_not_a_graceful_stop(storage: Storage) -> None:
    """The embedded flow sets ``stop_event`` when training ends: with the done marker there, the loop
    reports "done", so ``keep_partials`` keeps nothing for a resume that will not come."""
    CheckpointStore(storage).mark_done({"version": 3})
    stop = threading.Event()
    stop.set()
    summary = _run(_cfg(), storage, _rows(3), stop_event=stop)
    assert summary.stopped_by == "done"


def test_malformed_rows_raise_naming_index_and_field_or_are_skipped(storage: Storage) -> None:
    rows: list[Any] = _rows(4)
    rows[2] = {"prompt_id": "p2", "messages": "not a list", "answer": "1"}
    rows.append({"prompt_id": "p9", "messages": [{"role": "user"}], "answer": "1"})
    with pytest.raises(DatasetRowError, match=r"train row 2: field 'messages'"):
        _run(_cfg(max_epochs=1), storage, rows)
    cfg = _cfg(max_epochs=1)
    cfg.dataset.on_bad_row = "skip"
    summary = _run(cfg, storage, rows)
    assert summary.bad_rows == 2 and summary.accepted == 3
    assert check_row({"prompt_id": True, "messages": [], "answer": 1}) == (
        "field 'prompt_id': missing or not a string/int"
    )


def test_raising_rows_are_counted_and_too_many_stop_the_loop(storage: Storage) -> None:
    rows = _rows(40)
    for r in rows[::10]:
        r["explode"] = True  # 4 of 40 = 10 % < 20 %: the loop goes on
    summary = _run(_cfg(max_epochs=1), storage, rows)
    assert (summary.failed, summary.accepted) == (4, 36)
    with pytest.raises(RolloutFailureError, match="exploded on p"):
        # a second worker on the same trial: epoch 0 is claimed already, so it runs epoch 1
        _run(_cfg(max_epochs=2), storage, _rows(40, explode=True), writer_name="second")
    state = storage.get_json(keys.rollout_state_key("second"))
    assert state["failed"] >= 20  # more than 20 % of at least 20 episodes


def test_loop_loads_the_configured_dataset(tmp_path: Path) -> None:
    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})
    cfg = _cfg(max_epochs=1)
    cfg.dataset.max_rows = 6  # the synthetic task's train split, first 6 rows
    summary = asyncio.run(
        run_rollout_loop(cfg, storage, FakeClient(), workflow=OneRowWorkflow(), poll_interval_s=0.02)
    )
    assert summary.accepted == 6 and summary.bad_rows == 0


def test_build_workflow_from_config(tmp_path: Path) -> None:
    from rollflow.models.tokenizer import build_tokenizer
    from rollflow.workflows import MultiTurnWorkflow

    build_tokenizer().save_pretrained(tmp_path / "tok")
    cfg = _cfg(group_size=3)
    cfg.model.path = str(tmp_path / "tok")
    cfg.rollout.generation.max_new_tokens = 7
    wf = build_workflow(cfg)  # the default: RLVRWorkflow with the synthetic task's reward
    assert isinstance(wf, RLVRWorkflow) and wf.group_size == 3 and wf.sampling.max_new_tokens == 7
    assert wf.reward_runner.fn_name == "rollflow.rewards.synthetic:synthetic_reward_fn"  # type: ignore[attr-defined]
    wf.close()
    cfg.rollout.workflow = "rollflow.workflows.multi_turn:MultiTurnWorkflow"
    cfg.rollout.workflow_kwargs = {"max_turns": 3, "turn_discount": 0.5}
    multi = build_workflow(cfg)
    assert isinstance(multi, MultiTurnWorkflow) and (multi.max_turns, multi.turn_discount) == (3, 0.5)
    multi.close()
    # a class that takes no standard kwargs gets none of them
    cfg.rollout.workflow, cfg.rollout.workflow_kwargs = f"{__name__}:OneRowWorkflow", {}
    assert isinstance(build_workflow(cfg), OneRowWorkflow)


def test_summary_is_a_dataclass_for_the_task_adapter(storage: Storage) -> None:
    summary = _run(_cfg(max_epochs=1), storage, _rows(2))
    assert dataclasses.asdict(summary)["accepted"] == 2


# --- against the real CPU inference server, a checkpoint watcher and a slow fake trainer --------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ExactScorer:
    """In-process stand-in for AsyncRewardRunner: 1.0 for the exact answer."""

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> Any:
        return SimpleNamespace(
            score=float(completion.strip() == str(answer)), error=None, timed_out=False, infra_error=False
        )


def _tiny_rlvr(model_dir: Path, *, group_size: int = 2, max_new_tokens: int = 6) -> RLVRWorkflow:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = CHAT_TEMPLATE
    return RLVRWorkflow(
        reward_fn=lambda *a, **k: 0.0,
        tokenizer=tok,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0),
        group_size=group_size,
        reward_runner=ExactScorer(),
    )


def _arith_rows(n: int) -> list[dict[str, Any]]:
    return [
        {"prompt_id": f"a{i}", "messages": [{"role": "user", "content": f"{i}+{i}=?"}], "answer": str(2 * i)}
        for i in range(n)
    ]


class SlowTrainer(threading.Thread):
    """Consumes exactly B groups per version, oldest first, then sleeps and publishes version + 1."""

    def __init__(self, storage: Storage, model_dir: Path, *, batch: int, eta: int, steps: int, step_s: float):
        super().__init__(daemon=True)
        self.storage, self.model_dir = storage, model_dir
        self.batch, self.eta, self.steps, self.step_s = batch, eta, steps, step_s
        self.version = 0
        self.consumed: list[tuple[int, int]] = []  # (trainer version, group head version)
        self.dropped = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            reader, store = ShardReader(self.storage), CheckpointStore(self.storage)
            while self.version < self.steps and not self.stop.is_set():
                batch: list[TrajectoryGroup] = []
                while len(batch) < self.batch and not self.stop.is_set():
                    floor = self.version - self.eta
                    got = reader.take(self.batch - len(batch), min_head_version=floor if floor > 0 else None)
                    self.dropped += got.dropped_stale
                    batch += got.groups
                    if not got.groups:
                        time.sleep(0.05)
                self.consumed += [(self.version, g.head_version) for g in batch]
                time.sleep(self.step_s)  # "training"
                store.publish(self.model_dir, self.version + 1)
                self.version += 1
            store.mark_done({"version": self.version})
        except BaseException as e:  # surfaced by the test
            self.error = e


@pytest.mark.slow
def test_staleness_bound_holds_against_a_slow_trainer_and_across_a_restart(
    inference_lib: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rollflow.inference.client import EngineClient
    from rollflow.inference.watcher import CheckpointWatcher

    eta, batch = 1, 2
    cfg = _cfg(max_staleness=eta, max_concurrent_rollouts=6, group_size=2)
    cfg.train.batch_size = batch
    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})
    workflow, rows = _tiny_rlvr(tiny_model_dir), _arith_rows(50)
    over_capacity: list[str] = []

    def check(event: str, stat: Any, version: int) -> None:
        # capacity: running <= 6 and accepted + running <= (eta + version + 1) * B at every start
        if event == "submitted" and (
            stat.running > 6 or stat.accepted + stat.running > (eta + version + 1) * batch
        ):
            over_capacity.append(f"{stat} at version {version}")

    def segment(addresses: list[str], stop_when: Any) -> Any:
        client = EngineClient(addresses)
        watcher = CheckpointWatcher(
            CheckpointStore(storage), addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.1,
            on_update=client.set_version,
        )  # fmt: skip
        stop = threading.Event()
        threading.Thread(target=lambda: (stop_when(), stop.set()), daemon=True).start()
        watcher.start()

        async def run() -> Any:
            try:
                return await run_rollout_loop(
                    cfg, storage, client, version_fn=client.get_version, stop_event=stop, workflow=workflow,
                    prompts=rows, listeners=[check], writer_name="w", poll_interval_s=0.05, done_poll_s=0.2,
                )  # fmt: skip
            finally:
                await client.aclose()

        try:
            return asyncio.run(run())
        finally:
            stop.set()
            watcher.stop()

    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as servers:
        trainer = SlowTrainer(storage, tiny_model_dir, batch=batch, eta=eta, steps=6, step_s=0.3)
        trainer.start()
        try:
            first = segment(servers.addresses, lambda: _wait_for(lambda: trainer.version >= 3))
            on_disk = ShardReader(storage).count_committed_groups()
            second = segment(servers.addresses, lambda: _wait_for(lambda: False, timeout=60))  # a safety net
        finally:
            trainer.stop.set()
            trainer.join(30)
    assert trainer.error is None, trainer.error
    assert first.stopped_by == "stop_event" and second.stopped_by == "done"
    assert trainer.version == 6 and len(trainer.consumed) == 6 * batch
    # no consumed group is older than the trainer's version - eta, and the trainer never had to drop one
    assert all(head >= v - eta for v, head in trainer.consumed), trainer.consumed
    assert trainer.dropped == 0
    # the restart restored the count from storage, so the bound held across it
    assert second.total_accepted == on_disk + second.accepted
    assert not over_capacity, over_capacity[:3]
    # the formula's bottom line: at the end at most (eta + V + 1) * B groups exist
    assert ShardReader(storage).count_committed_groups() <= (eta + trainer.version + 1) * batch


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def hang_on_seven(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """A reward (run in the runner's worker processes) that hangs on prompts containing a 7."""
    if "7" in prompt:
        time.sleep(600)
    return float(completion.strip() == str(answer))


def test_loop_on_the_real_server_survives_hanging_rewards_bad_rows_and_failing_episodes(
    cpu_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from rollflow.api.metrics import InMemorySink
    from rollflow.inference.client import EngineClient

    storage = Storage.open(str(tmp_path / "store"), "exp", "t0", {})  # S3 is covered by the tests above
    cfg = _cfg(max_epochs=1, group_size=2, reward_timeout_s=0.5, reward_workers=2)
    cfg.rollout.generation.max_new_tokens = 4
    cfg.dataset.reward_fn = f"{__name__}:hang_on_seven"
    cfg.dataset.on_bad_row = "skip"
    questions = ["1+1=?", "7+1=?", "2+2=?", "1+7=?", "3+3=?"]
    rows: list[Any] = [
        {"prompt_id": f"q{i}", "messages": [{"role": "user", "content": q}], "answer": str(eval(q[:-2]))}
        for i, q in enumerate(questions)
    ]
    rows.append(
        {"prompt_id": "long", "messages": [{"role": "user", "content": "1+" * 600 + "1=?"}], "answer": "601"}
    )
    rows += [{"prompt_id": "no-messages", "answer": "1"}, ["not", "a", "row"]]  # malformed: skipped, counted
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = CHAT_TEMPLATE
    workflow = build_workflow(cfg, tokenizer=tok)
    sink = InMemorySink()

    async def run() -> Any:
        client = EngineClient(cpu_server.addresses)
        try:
            return await run_rollout_loop(
                cfg, storage, client, workflow=workflow, prompts=rows, metrics=sink, poll_interval_s=0.05
            )
        finally:
            await client.aclose()

    try:
        summary = asyncio.run(run())
    finally:
        workflow.close()  # type: ignore[attr-defined]
    assert summary.stopped_by == "epochs"
    assert summary.bad_rows == 2
    # 1 + 2 * 600 + 2 tokens > the 1024-token context: the server refuses, that episode raises and is counted
    assert (summary.accepted, summary.failed) == (5, 1)
    groups = {g.prompt_id: g for g in ShardReader(storage).take(100).groups}
    assert sorted(groups) == ["q0", "q1", "q2", "q3", "q4"]
    for pid in ("q1", "q3"):  # the hanging reward timed out: 0 points, marked, and the loop went on
        assert all(r.reward == 0.0 and '"reward_timed_out": true' in r.extra for r in groups[pid].rows)
    for pid in ("q0", "q2", "q4"):
        assert all("reward_timed_out" not in r.extra for r in groups[pid].rows)
    assert workflow.reward_runner.stats.timeouts == 4  # type: ignore[attr-defined]  # 2 prompts x 2 samples
    assert sink.last("reward_timeouts") == 4.0 and sink.last("episodes_failed") == 1.0
    assert storage.get_json(keys.rollout_state_key("rollout"))["failed"] == 1


def test_rollout_state_precedence() -> None:
    from rollflow.rollout.worker_report import rollout_state

    assert rollout_state(8, 0, loading=True) == "paused"  # a weight load has the servers paused
    assert rollout_state(8, 0, loading=False) == "generating"  # at the bound, but the servers work
    assert rollout_state(0, 0, loading=False) == "capacity_wait"  # nothing runs: the bound holds it back
    assert rollout_state(8, 5, loading=False) == "generating"
    assert rollout_state(0, 5, loading=False) == "idle"
    # the named waits: a buffer being committed comes first (the trainer may wait for exactly it), then the
    # trainer's version, then the claim gate, then the end of the data
    assert rollout_state(0, 0, loading=False, buffered=True, claim_blocked=True) == "flush_wait"
    assert rollout_state(0, 0, loading=False, claim_blocked=True) == "capacity_wait"
    assert rollout_state(0, 5, loading=False, claim_blocked=True, exhausted=True) == "claim_wait"
    assert rollout_state(0, 5, loading=False, exhausted=True) == "exhausted"
    assert rollout_state(2, 5, loading=False, buffered=True) == "generating"


def test_staleness_room_is_the_bound_without_the_concurrency_cap() -> None:
    from rollflow.rollout.staleness import StalenessManager

    m = StalenessManager(max_concurrent=2, max_staleness=0, consumer_batch_size=4)
    assert m.staleness_room(0) == 4 and m.get_capacity(0) == 2
    for _ in range(2):
        m.on_rollout_submitted()
    assert m.staleness_room(0) == 2 and m.get_capacity(0) == 0  # concurrency, not the bound, holds them
    assert m.staleness_room(1) == 6
