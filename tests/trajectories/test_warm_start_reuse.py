"""Reuse: a trial warm-started from another trial's record trains its first steps on exactly that trial's
committed groups (commit order), with their stored behaviour logprobs in the loss, then on its own
groups; the source is not written; bad sources are refused with the field named. Real storage, real
ShardWriter and real Trainer on the tiny model; no servers."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config
from rollflow.trial.record import write_config_record
from rollflow.trial.store import open_trial_storage
from storage import keys
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow
from storage.shard_writer import ShardWriter

BATCH, GROUP, REUSED, OWN = 4, 2, 6, 6  # 6 reused groups: step 2 takes 2 reused + 2 own


def _groups(prefix: str, n: int, seed: int) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    out = []
    for g in range(n):
        prompt = [rng.randrange(4, 30) for _ in range(5)]
        rows = [
            TrajectoryRow.build(
                traj_id=f"{prefix}{g}-{i}", group_id=f"{prefix}{g}", prompt_id=f"{prefix}p{g}",
                input_ids=prompt + [rng.randrange(4, 30) for _ in range(3)],
                loss_mask=[0] * 5 + [1] * 3,
                logprobs=[0.0] * 5 + [-0.5 - rng.random() for _ in range(3)],
                versions=[-1] * 5 + [0] * 3,
                reward=float(i == g % GROUP), finish_reason="stop",
            )
            for i in range(GROUP)
        ]  # fmt: skip
        out.append(TrajectoryGroup(f"{prefix}{g}", f"{prefix}p{g}", rows))
    return out


def _write(storage: Storage, groups: list[TrajectoryGroup]) -> None:
    with ShardWriter(storage, "w", flush_rows=3 * GROUP, flush_seconds=3600.0) as w:
        for g in groups:
            w.add(g)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from rollflow.models.bootstrap import bootstrap_tiny_model

    tmp = tmp_path_factory.mktemp("reuse")
    base = load_config("configs/tiny_cpu.yaml")
    tiny = dataclasses.replace(base.model.tiny, warm_start_steps=0)
    model = bootstrap_tiny_model(tiny, tmp / "model", seed=base.seed, task=base.dataset.synthetic.task)
    data = {
        "trial": "source",
        "storage": {"root": str(tmp / "store"), "keep_checkpoints": 10},
        "model": {"path": str(model), "bootstrap_tiny": False},
        "rollout": {"max_staleness": 1000, "group_size": GROUP},
        "train": {"steps": 3, "batch_size": BATCH, "threads": 1, "resume_every": 10},
    }
    src_cfg = load_config("configs/tiny_cpu.yaml", data=data)
    src = open_trial_storage(src_cfg)
    source_groups = _groups("s", 8, seed=0)
    _write(src, source_groups)
    write_config_record(src, src_cfg)  # what a trial started by the flow records
    return data, source_groups, tmp


def _cfg(data: dict, **warm):  # noqa: ANN001, ANN202
    return load_config(
        "configs/tiny_cpu.yaml",
        data={**data, "trial": "warm", "train": {**data["train"], "warm_start_from": warm}},
    )


def test_warm_start_trains_on_the_source_groups_then_online(setup) -> None:  # noqa: ANN001
    from rollflow.training.warm_start_reuse import (
        RECORD_KEY,
        WarmStartTrainer,
        trainer_class,
        warm_start_tags,
    )

    data, source_groups, tmp = setup
    cfg = _cfg(data, trial="source", max_groups=REUSED)
    assert trainer_class(cfg) is WarmStartTrainer
    assert warm_start_tags(cfg) == {"rollflow.warm_start_from": f"{cfg.experiment}/source"}
    assert trainer_class(load_config("configs/tiny_cpu.yaml", data=data)).__name__ == "Trainer"
    storage = open_trial_storage(cfg)
    own = _groups("o", OWN, seed=1)
    _write(storage, own)
    source_dir = tmp / "store" / cfg.experiment / "source"
    before = _tree(source_dir)
    seen = []

    class Capturing(WarmStartTrainer):
        def _setup(self) -> None:
            super()._setup()
            update = self.actor.ppo_update

            def capture(batch, plans, **kw):  # noqa: ANN001, ANN003, ANN202
                seen.append(batch)
                return update(batch, plans, **kw)

            self.actor.ppo_update = capture  # type: ignore[method-assign]

    summary = Capturing(cfg, storage).run()
    assert summary.final_version == 3
    steps = [storage.get_json(keys.consumed_key(k))["groups"] for k in (1, 2, 3)]
    reused = [g.group_id for g in source_groups[:REUSED]]  # commit order = the order they were written
    assert steps[0] + steps[1][:2] == reused
    assert steps[1][2:] + steps[2] == [g.group_id for g in own]
    assert summary.groups_consumed == OWN  # reused groups are not this trial's own
    record = storage.get_json(RECORD_KEY)
    assert record["trial"] == "source" and record["group_ids"] == reused and record["steps"] == 2
    assert _tree(source_dir) == before  # nothing written into the source trial

    # step 1's loss input: the stored behaviour logprobs of the reused rows, token for token
    batch = seen[0]
    assert [g.group_id for g in batch.groups] == reused[:BATCH]
    for info, group in zip(batch.groups, source_groups[:BATCH], strict=True):
        for r, row in zip(info.rows, group.rows, strict=True):
            mask = batch.loss_mask[r].bool()
            stored = torch.tensor(row.logprobs, dtype=torch.float32)[torch.tensor(row.loss_mask).bool()]
            assert torch.equal(batch.behav_logp[r][mask], stored)
    # and the importance weight is taken against them: w = exp(prox - behav) differs from 1
    assert batch.prox_logp is not None
    w = torch.exp(batch.prox_logp - batch.behav_logp)[batch.loss_mask.bool()]
    assert not torch.allclose(w, torch.ones_like(w))


def test_a_restart_mid_warm_start_goes_on_from_the_next_reused_group(setup) -> None:  # noqa: ANN001
    import threading

    from rollflow.training.warm_start_reuse import WarmStartTrainer

    data, source_groups, _ = setup
    cfg = dataclasses.replace(_cfg(data, trial="source", max_groups=REUSED), trial="restarted")
    storage = open_trial_storage(cfg)
    own = _groups("o", OWN, seed=1)
    _write(storage, own)
    stop = threading.Event()

    class StopAfterOne:
        def before_step(self, version: int) -> None:
            pass

        def after_step(self, version: int) -> None:
            stop.set()

    first = WarmStartTrainer(cfg, storage, stop_event=stop, hooks=StopAfterOne()).run()
    assert first.stopped and first.final_version == 1
    second = WarmStartTrainer(cfg, storage).run()
    assert second.final_version == 3 and second.resumed_from == 1
    steps = [storage.get_json(keys.consumed_key(k))["groups"] for k in (1, 2, 3)]
    assert steps[0] + steps[1][:2] == [g.group_id for g in source_groups[:REUSED]]
    assert steps[1][2:] + steps[2] == [g.group_id for g in own]
    assert second.groups_consumed == OWN


def test_refusals(setup) -> None:  # noqa: ANN001
    from rollflow.training.warm_start_reuse import load_warm_start

    data, _, tmp = setup
    with pytest.raises(ConfigError, match=r"train\.warm_start_from\.trial.*no trial 'nope'"):
        load_warm_start(_cfg(data, trial="nope"))
    other = {**data, "model": {**data["model"], "path": str(tmp)}}
    with pytest.raises(ConfigError, match=r"train\.warm_start_from\.trial.*another model.*model\.path"):
        load_warm_start(_cfg(other, trial="source"))
    empty_cfg = load_config("configs/tiny_cpu.yaml", data={**data, "trial": "empty"})
    write_config_record(open_trial_storage(empty_cfg), empty_cfg)
    with pytest.raises(ConfigError, match=r"train\.warm_start_from\.trial.*no committed trajectory group"):
        load_warm_start(_cfg(data, trial="empty"))
    with pytest.raises(ConfigError, match="this trial itself"):
        load_warm_start(_cfg(data, trial="warm"))
    with pytest.raises(ConfigError, match=r"train\.warm_start_from\.max_groups"):
        _cfg(data, trial="source", max_groups=0)
