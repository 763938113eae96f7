"""Replay: the real Trainer trains a small trial on shards written by the real ShardWriter (no servers),
then `replay` reruns it from the trial's record (consumed logs, shards, a resume point) and compares
every published version bit for bit; a tampered consumed log is found at the step it changed."""

from __future__ import annotations

import dataclasses
import random

import pytest

from rollflow.configuration.loader import load_config
from rollflow.trial.record import write_config_record
from rollflow.trial.store import open_trial_storage
from storage import keys
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter

STEPS, BATCH, GROUP = 4, 4, 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from rollflow.models.bootstrap import bootstrap_tiny_model
    from rollflow.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("replay")
    base = load_config("configs/tiny_cpu.yaml")
    tiny = dataclasses.replace(base.model.tiny, warm_start_steps=0)
    model = bootstrap_tiny_model(tiny, tmp / "model", seed=base.seed, task=base.dataset.synthetic.task)
    cfg = load_config(
        "configs/tiny_cpu.yaml",
        data={
            "trial": "orig",
            "storage": {"root": str(tmp / "store"), "keep_checkpoints": STEPS + 2},
            "model": {"path": str(model), "bootstrap_tiny": False},
            "rollout": {"max_staleness": 1000, "group_size": GROUP},
            "train": {
                "steps": STEPS,
                "batch_size": BATCH,
                "threads": 1,
                "checkpoint_every": 1,
                "resume_every": 2,
            },
        },
    )
    storage = open_trial_storage(cfg)
    rng = random.Random(0)
    with ShardWriter(storage, "w", flush_rows=BATCH * GROUP, flush_seconds=3600.0) as w:
        for g in range(STEPS * BATCH):
            prompt = [rng.randrange(4, 30) for _ in range(6)]
            rows = [
                TrajectoryRow.build(
                    traj_id=f"g{g}-{i}", group_id=f"g{g}", prompt_id=f"p{g}",
                    input_ids=prompt + [rng.randrange(4, 30) for _ in range(4)],
                    loss_mask=[0] * 6 + [1] * 4,
                    logprobs=[0.0] * 6 + [-rng.random() * 3 for _ in range(4)],
                    versions=[-1] * 6 + [0] * 4,
                    reward=float(rng.random() < 0.5), finish_reason="stop",
                )
                for i in range(GROUP)
            ]  # fmt: skip
            w.add(TrajectoryGroup(f"g{g}", f"p{g}", rows))
    write_config_record(storage, cfg)  # what a trial started by the flow records
    summary = Trainer(cfg, storage).run()
    assert summary.final_version == STEPS
    return cfg, storage, tmp


def test_replay_is_bit_for_bit(trained) -> None:  # noqa: ANN001
    from rollflow.training.replay import replay

    cfg, storage, tmp = trained
    report = replay(cfg, storage, to_version=STEPS, work_dir=tmp / "work")
    assert report.start_version == 0 and report.steps == STEPS
    assert [v.version for v in report.versions] == [1, 2, 3, 4]
    assert report.identical, report.summary()
    assert "bit for bit identical" in report.summary()


def test_replay_from_resume_point_finds_a_changed_record(trained) -> None:  # noqa: ANN001
    """From the resume point at v2: v3 is identical (the resume path is exact), and a consumed log
    whose step-4 batch was changed makes v4 differ, which the report says."""
    from rollflow.training.replay import ReplayError, replay

    cfg, storage, tmp = trained
    key = keys.consumed_key(4)
    original = storage.get_bytes(key)
    doc = storage.get_json(key)
    doc["groups"] = [doc["groups"][0]] * len(doc["groups"])  # the first group four times
    storage.put_json(key, doc)
    try:
        report = replay(cfg, storage, to_version=STEPS, work_dir=tmp / "work", from_resume_point=True)
    finally:
        storage.put_bytes(key, original)
    assert report.start_version == 2 and [v.version for v in report.versions] == [3, 4]
    assert report.versions[0].identical and not report.versions[1].identical
    assert report.first_divergent == 4 and not report.identical
    assert "DIFFERENT from v4 on" in report.summary() and "max |diff|" in report.summary()
    with pytest.raises(ReplayError, match="not committed"):
        replay(cfg, storage, to_version=STEPS + 5, work_dir=tmp / "work")


def test_cli_replay(trained, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    from flows.cli import main as cli

    cfg, _, tmp = trained
    over = [
        f"storage.root={cfg.storage.root}",
        f"model.path={cfg.model.path}",
        f"experiment={cfg.experiment}",
    ]
    assert cli(["replay", "orig", "--to", "2", "--work-dir", str(tmp / "cli"), *over]) == 0
    assert "bit for bit identical" in capsys.readouterr().out
    assert cli(["replay", "orig", "--to", "9", "--work-dir", str(tmp / "cli"), *over]) == 2
    assert "v9 is not committed" in capsys.readouterr().err
