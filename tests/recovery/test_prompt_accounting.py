"""The storage audit of prompt positions (``bench.prompt_audit.audit_trial``), on trials made by the real
rollout loop with a fake inference client, and then damaged on purpose.

Every position of every claimed block must end committed, dropped (a recorded count) or open in a state
file; the audit must notice a committed shard that vanished, a shard committed twice, positions that
were forgotten, and a group trained twice. The last test is the restart it was built to catch: a worker
killed between taking its predecessor's blocks over and writing its state file.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import uuid
from typing import Any

import pytest

from bench.prompt_audit import Audit, audit_trial
from rollflow.api.config import ExperimentConfig
from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.loop import run_rollout_loop
from storage import keys
from storage.commits import CommitRecord
from storage.fs import Storage
from storage.prompt_claims import ClaimLog
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_reader import ShardReader

ROWS = [
    {
        "prompt_id": f"p{i}",
        "messages": [{"role": "user", "content": f"q{i}"}],
        "answer": "1",
        "drop": i % 5 == 0,
    }
    for i in range(40)
]


class Client:
    """One token at version 0; never returns while ``hang``."""

    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        while self.hang:
            await asyncio.sleep(0.01)
        return GenerateResult(req.rid or "r", req.input_ids, [5], [-0.1], [0], "stop")

    def get_version(self) -> int:
        return 0


class Workflow(RolloutWorkflow):
    """A group of two rows per prompt; ``None`` (a rejection, counted as released) for rows marked drop.
    ``solved``: both rows rewarded 1.0 (a group the prompt curriculum calls solved), else 0.0 and 1.0."""

    def __init__(self, *, solved: bool = False) -> None:
        self.solved = solved

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        await client.agenerate(GenerateRequest([1, 2]))
        if data["drop"]:
            return None
        gid = uuid.uuid4().hex
        rows = [
            TrajectoryRow.build(
                traj_id=f"{gid}-{j}",
                group_id=gid,
                prompt_id=data["prompt_id"],
                input_ids=[1, 2, 5],
                loss_mask=[0, 0, 1],
                logprobs=[0.0, 0.0, -0.1],
                versions=[-1, -1, 0],
                reward=1.0 if self.solved else float(j),
                finish_reason="stop",
            )  # fmt: skip
            for j in range(2)
        ]
        return TrajectoryGroup(gid, data["prompt_id"], rows)


def _cfg(**rollout: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.train.batch_size = 4
    cfg.rollout.claim_block_size = 2
    cfg.rollout.max_concurrent_rollouts = 4
    cfg.rollout.max_staleness = 100
    cfg.rollout.shard_flush_rows = 4
    cfg.rollout.shard_flush_seconds = 0.05
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


def _roll(
    storage: Storage,
    cfg: ExperimentConfig,
    client: Client,
    *,
    seconds: float | None = None,
    workflow: Workflow | None = None,
) -> Any:
    stop = threading.Event()
    if seconds is not None:
        threading.Timer(seconds, stop.set).start()
    return asyncio.run(
        run_rollout_loop(
            cfg, storage, client, prompts=ROWS, workflow=workflow or Workflow(), stop_event=stop,
            writer_name="rollout-w0",
            poll_interval_s=0.02, done_poll_s=0.1,
        )
    )  # fmt: skip


def _train(storage: Storage, steps: int, batch: int = 4) -> list[list[str]]:
    """What a trainer leaves: consumed records, DONE.json, the final checkpoint's COMMIT.json and LATEST,
    FINALIZED.json (only the fields the audit reads)."""
    reader = ShardReader(storage)
    trained = []
    for step in range(1, steps + 1):
        groups = [g.group_id for g in reader.take(batch).groups]
        storage.put_json(f"trainer/consumed/step-{step:08d}.json", {"step": step, "groups": groups})
        trained.append(groups)
    storage.put_json(keys.TRAINER_DONE_KEY, {"version": steps})
    storage.put_json(keys.checkpoint_commit_key(steps), {"files": {}})
    storage.put_json(keys.LATEST_KEY, {"version": steps, "path": keys.checkpoint_dir(steps)})
    storage.put_json(keys.FINALIZED_KEY, {"final_version": steps})
    return trained


def _audit(storage: Storage, cfg: ExperimentConfig) -> Audit:
    block = min(cfg.rollout.claim_block_size, cfg.train.batch_size)
    return audit_trial(storage, ROWS, seed=cfg.seed, block_size=block, max_epochs=cfg.rollout.max_epochs)


@pytest.fixture
def trial(tmp_path: Any) -> tuple[Storage, ExperimentConfig]:
    """A whole trial: 12 groups committed, the rows marked drop rejected, 2 steps trained, finalized."""
    storage = Storage.open(str(tmp_path), "exp", "t", {})
    cfg = _cfg(max_groups=12)
    _roll(storage, cfg, Client())
    _train(storage, steps=2)
    return storage, cfg


def test_a_whole_trial_accounts_for_every_position(trial: tuple[Storage, ExperimentConfig]) -> None:
    storage, cfg = trial
    a = _audit(storage, cfg)
    assert a.ok, a
    assert a.positions_committed == a.groups_committed >= 12
    assert a.positions_dropped == a.drops_recorded > 0  # every 5th prompt was rejected, and counted
    assert a.positions_handed_out == a.positions_committed + a.positions_dropped + a.positions_open_at_end
    assert a.positions_unaccounted == a.positions_generated_twice == 0
    assert (a.groups_trained, a.groups_trained_twice, a.final_version) == (8, 0, 2)


def test_prompts_the_curriculum_skips_are_accounted_as_dropped(tmp_path: Any) -> None:
    """Every group solved: from the second epoch on the curriculum skips most prompts unseen; each skipped
    position is released and recorded, so the audit still accounts for every position handed out."""
    storage = Storage.open(str(tmp_path), "exp", "t", {})
    cfg = _cfg(max_groups=48, skip_solved_prob=0.9)  # 40 rows: the first epoch, then 8 more groups
    summary = _roll(storage, cfg, Client(), workflow=Workflow(solved=True))
    assert summary.skipped > 0 and "skipped by the curriculum" in summary.brief()
    _train(storage, steps=2)
    a = _audit(storage, cfg)
    assert a.ok, a
    assert a.positions_committed == a.groups_committed >= 48
    # skipped (and dropped) positions: recorded as released, and more than the drop rows alone
    assert a.positions_dropped == a.drops_recorded > 8 + 8
    assert a.positions_handed_out == a.positions_committed + a.positions_dropped + a.positions_open_at_end
    assert a.positions_unaccounted == a.positions_generated_twice == 0


class MovingClient(Client):
    """The trainer's version moves one step every 8 requests (the prompt review's clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        self.calls += 1
        return await super().agenerate(req)

    def get_version(self) -> int:
        return self.calls // 8


def test_slots_the_prompt_review_gave_to_solved_prompts_are_accounted_by_position(tmp_path: Any) -> None:
    """Every group solved, review share 0.5: within the first epoch solved prompts come back in other
    prompts' slots, so a prompt is committed twice in one epoch and another not at all. The commit
    records name positions, so the audit still finds every position once and nothing generated twice."""
    storage = Storage.open(str(tmp_path), "exp", "t", {})
    cfg = _cfg(max_groups=40, review_share=0.5, review_interval=1)
    _roll(storage, cfg, MovingClient(), workflow=Workflow(solved=True))
    from bench.prompt_audit import _committed_groups

    committed = _committed_groups(storage, Audit())
    per_prompt = collections.Counter(pid for _, pid, _ in committed)
    assert max(per_prompt.values()) >= 2  # reviews ran: some prompt twice in its first epoch's slots
    assert all(pos is not None for _, _, pos in committed)
    _train(storage, steps=2)
    a = _audit(storage, cfg)
    assert a.ok, a
    assert a.positions_committed == a.groups_committed >= 40
    assert a.positions_unaccounted == a.positions_generated_twice == 0


def test_a_committed_shard_that_vanished_is_reported(trial: tuple[Storage, ExperimentConfig]) -> None:
    storage, cfg = trial
    rec = CommitRecord.from_json(storage.get_json(storage.list(keys.COMMIT_DIR)[0]))
    storage.delete(rec.shard_key)
    a = _audit(storage, cfg)
    assert not a.ok
    assert a.positions_unaccounted == rec.groups  # its prompts are neither committed, dropped nor open
    assert a.groups_trained_not_committed == rec.groups  # the oldest shard was trained first
    assert any("is missing" in p for p in a.problems), a.problems


def test_a_shard_committed_twice_is_reported(trial: tuple[Storage, ExperimentConfig]) -> None:
    storage, cfg = trial
    rec = CommitRecord.from_json(storage.get_json(storage.list(keys.COMMIT_DIR)[-1]))
    writer, seq = "rollout-w0-0badc0de", 1  # a second life that wrote the same groups again
    copy = dataclasses.replace(
        rec, writer=writer, seq=seq, commit_id=keys.commit_id(writer, seq),
        key=keys.commit_key(rec.partition, writer, seq), shard_key=keys.shard_key(writer, f"{seq:08d}"),
    )  # fmt: skip
    storage.put_bytes(copy.shard_key, storage.get_bytes(rec.shard_key))
    storage.put_bytes(copy.key, copy.to_bytes(), exclusive=True)
    a = _audit(storage, cfg)
    assert not a.ok
    assert a.positions_generated_twice == a.groups_committed_twice == rec.groups


def test_a_block_claimed_and_never_recorded_is_unaccounted(trial: tuple[Storage, ExperimentConfig]) -> None:
    """What a skipped block looks like: claimed, then the worker died before its state file named it, so
    nobody ever runs its prompts (claimed here by hand, as that worker would have)."""
    storage, cfg = trial
    claims = ClaimLog(storage)
    assert claims.try_claim(claims.next_block(), "rollout-w0-0badc0de", "rollout-w0")
    a = _audit(storage, cfg)
    assert not a.ok and a.positions_unaccounted == 2  # claim_block_size 2


def test_a_group_trained_twice_is_reported(trial: tuple[Storage, ExperimentConfig]) -> None:
    storage, cfg = trial
    one, two = (storage.get_json(f"trainer/consumed/step-{s:08d}.json") for s in (1, 2))
    storage.put_json(
        "trainer/consumed/step-00000002.json", {**two, "groups": [*two["groups"], one["groups"][0]]}
    )
    a = _audit(storage, cfg)
    assert not a.ok and a.groups_trained_twice == 1


def test_a_trial_without_its_final_checkpoint_is_not_final(trial: tuple[Storage, ExperimentConfig]) -> None:
    storage, cfg = trial
    storage.delete(keys.FINALIZED_KEY)
    a = _audit(storage, cfg)
    assert not a.final_committed and not a.ok


def test_a_worker_killed_right_after_taking_its_blocks_over_leaves_them_to_the_next_life(
    tmp_path: Any,
) -> None:
    """Life 1 holds 4 blocks open (version 0 allows (0 + 0 + 1) * 4 = 4 prompts with max_staleness 0, so
    no other block may be claimed) and stops. Life 2 takes them over (``takeovers/{b}-001``) and is
    killed before its first state put: the state file still says generation 0. Life 3 must still run
    those prompts: generation 1 was taken by an earlier life of the same worker, so it takes generation 2.
    Before the fix, life 3 adopted nothing and the 4 prompts were skipped for good."""
    storage = Storage.open(str(tmp_path), "exp", "t", {})
    cfg = _cfg(max_staleness=0, claim_block_size=1)
    rows_held = _roll(storage, cfg, Client(hang=True), seconds=0.5)
    assert rows_held.accepted == 0
    blocks = storage.get_json(keys.rollout_state_key("rollout-w0"))["blocks"]
    assert sorted(blocks) == ["0", "1", "2", "3"] and all(b["gen"] == 0 for b in blocks.values())
    claims = ClaimLog(storage)
    for b in blocks:  # life 2's takeovers; it was killed before writing its state
        assert claims.try_take_over(int(b), 1, "rollout-w0-0badc0de")
    _roll(storage, cfg, Client(), seconds=1.5)  # life 3
    takeovers = storage.list("prompts/takeovers")
    assert sorted(k.rsplit("/", 1)[-1] for k in takeovers if k.endswith("-002.json")) == [
        f"{b:010d}-002.json" for b in range(4)
    ]
    a = _audit(storage, cfg)  # (before the fix: 4 handed out, 0 committed, 4 unaccounted)
    assert a.positions_committed + a.positions_dropped >= 4, a
    assert a.positions_handed_out == a.positions_committed + a.positions_dropped + a.positions_open_at_end
    assert a.positions_unaccounted == 0 and a.positions_generated_twice == 0
