"""The Trainer end to end, in process, on real shards in local storage and on moto S3."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import write_groups
from safetensors.torch import load_file

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import TrainerError
from rollflow.api.metrics import InMemorySink
from rollflow.configuration.loader import load_config
from rollflow.training.resume import list_resume_steps
from rollflow.training.trainer import Trainer
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.keys import consumed_key


def make_cfg(
    root: str, experiment: str, trial: str, model_dir: Path, options: dict | None = None, **train: Any
) -> ExperimentConfig:
    data = {
        "experiment": experiment,
        "trial": trial,
        "storage": {"root": root, "options": options or {}},
        "model": {"path": str(model_dir)},
        "rollout": {
            "max_staleness": train.pop("max_staleness", 100),
            "group_size": 4,
            "pause_during_training": train.pop("pause_during_training", False),
        },
        "train": {
            "steps": 3,
            "batch_size": 2,
            "lr": 1e-3,
            "max_tokens_per_mb": 64,
            "resume_every": 2,
            "data_wait_timeout_s": 10.0,
            **train,
        },
    }
    return load_config(data=data)


def _cfg(spec, model_dir: Path, **train: Any) -> ExperimentConfig:
    return make_cfg(spec.root, spec.experiment, spec.trial, model_dir, spec.options, **train)


def consumed(storage, steps: int) -> list[list[str]]:
    return [storage.get_json(consumed_key(s))["groups"] for s in range(1, steps + 1)]


def published_weights(storage, version: int) -> dict[str, torch.Tensor]:
    path = storage.local_path(keys.checkpoint_dir(version)) / "model.safetensors"
    return load_file(str(path))


def test_fresh_run(storage_spec, tiny_model_dir: Path) -> None:
    storage = storage_spec.open()
    gids = [f"g{i:02d}" for i in range(7)]  # one more than 3 steps x 2 groups: it must stay unconsumed
    write_groups(storage, gids, per_shard=3)
    sink = InMemorySink()
    summary = Trainer(_cfg(storage_spec, tiny_model_dir), storage, metrics=sink).run()

    assert (summary.final_version, summary.steps_run, summary.groups_consumed) == (3, 3, 6)
    assert summary.done and not summary.stopped and summary.resumed_from is None
    assert summary.published_versions == [0, 1, 2, 3]  # v0 = the initial weights
    assert consumed(storage, 3) == [["g00", "g01"], ["g02", "g03"], ["g04", "g05"]]  # oldest first
    store = CheckpointStore(storage)
    assert store.resolve_latest().version == 3  # type: ignore[union-attr]
    done = store.is_done()
    assert done is not None and done["version"] == 3 and done["groups_consumed"] == 6
    for name in (
        "loss",
        "reward_mean",
        "entropy",
        "clip_frac",
        "behav_weight_mean",
        "behav_weight_max",
        "behav_masked_frac",
        "approx_kl",
        "grad_norm",
        "lr",
        "staleness_mean",
        "staleness_max",
        "dropped_stale",
        "train_tokens_per_s",
        "commit_to_consume_s",
        "step_time_s",
    ):
        assert len(sink.values(name)) >= 1, name
    assert sink.values("version") == [1.0, 2.0, 3.0]
    assert sink.values("staleness_max") == [0.0, 1.0, 2.0]  # data of version 0 consumed at versions 0, 1, 2


def test_stale_groups_are_dropped_and_counted(local_storage, tiny_model_dir: Path) -> None:
    write_groups(local_storage, ["a0", "a1", "old0", "old1"], per_shard=2, version=0)
    write_groups(local_storage, ["b0", "b1"], per_shard=2, version=1)
    cfg = make_cfg(
        str(local_storage.base).rsplit("/", 2)[0],
        "test",
        local_storage.base.rsplit("/", 1)[1],
        tiny_model_dir,
        steps=2,
        max_staleness=0,
    )
    sink = InMemorySink()
    summary = Trainer(cfg, local_storage, metrics=sink).run()
    # version 0 takes a0, a1; at version 1 the bound is head >= 1: old0, old1 are dropped, b0, b1 taken
    assert consumed(local_storage, 2) == [["a0", "a1"], ["b0", "b1"]]
    assert summary.dropped_stale == 2 and sink.values("dropped_stale") == [0.0, 2.0]


class StopAt:
    """TrainerHooks that record calls and set the stop event after a given version."""

    def __init__(
        self, stop: threading.Event, at: int | None = None, store: CheckpointStore | None = None
    ) -> None:
        self.stop, self.at, self.store, self.calls = stop, at, store, []

    def before_step(self, version: int) -> None:
        self.calls.append(("before", version))

    def after_step(self, version: int) -> None:
        latest = self.store.resolve_latest().version if self.store else None  # type: ignore[union-attr]
        self.calls.append(("after", version, latest))
        if version == self.at:
            self.stop.set()


def test_stop_and_resume_reproduce_the_uninterrupted_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    from storage.fs import Storage

    gids = [f"g{i:02d}" for i in range(8)]
    root = str(tmp_path / "store")
    straight = Storage.open(root, "test", "straight")
    write_groups(straight, gids)
    s1 = Trainer(make_cfg(root, "test", "straight", tiny_model_dir, steps=4, resume_every=3), straight).run()
    assert s1.done

    split = Storage.open(root, "test", "split")
    write_groups(split, gids)
    cfg = make_cfg(root, "test", "split", tiny_model_dir, steps=4, resume_every=3)
    stop = threading.Event()
    first = Trainer(cfg, split, stop_event=stop, hooks=StopAt(stop, at=2)).run()
    assert first.stopped and not first.done and first.final_version == 2
    assert CheckpointStore(split).is_done() is None
    assert list_resume_steps(split) == [2]  # written at the stop (resume_every=3 would not have)

    second = Trainer(cfg, split).run()
    assert second.resumed_from == 2 and second.steps_run == 2 and second.done
    assert second.published_versions == [3, 4]  # v0..v2 already out: never re-published
    assert consumed(split, 4) == consumed(straight, 4) == [gids[0:2], gids[2:4], gids[4:6], gids[6:8]]
    a, b = published_weights(straight, 4), published_weights(split, 4)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0)  # bit-exact: weights, Adam moments, lr


def test_sync_baseline_publishes_before_after_step(local_storage, tiny_model_dir: Path) -> None:
    write_groups(local_storage, ["g0", "g1"], version=0)
    write_groups(local_storage, ["g2", "g3"], version=1)  # on-policy for step 2 (max_staleness 0)
    base, trial = local_storage.base.rsplit("/", 2)[0], local_storage.base.rsplit("/", 1)[1]
    cfg = make_cfg(base, "test", trial, tiny_model_dir, steps=2, max_staleness=0, pause_during_training=True)
    hooks = StopAt(threading.Event(), store=CheckpointStore(local_storage))
    Trainer(cfg, local_storage, hooks=hooks).run()
    # before_step(v) runs once the batch is in hand; after_step(v+1) only once v+1 is committed
    assert hooks.calls == [("before", 0), ("after", 1, 1), ("before", 1), ("after", 2, 2)]


def test_no_data_times_out(local_storage, tiny_model_dir: Path) -> None:
    base, trial = local_storage.base.rsplit("/", 2)[0], local_storage.base.rsplit("/", 1)[1]
    cfg = make_cfg(base, "test", trial, tiny_model_dir, data_wait_timeout_s=0.5)
    with pytest.raises(TrainerError, match="no new trajectory group"):
        Trainer(cfg, local_storage).run()
    assert CheckpointStore(local_storage).resolve_latest().version == 0  # type: ignore[union-attr]


def test_option_variants_run_and_checkpoint_every(local_storage, tiny_model_dir: Path) -> None:
    write_groups(local_storage, [f"g{i}" for i in range(6)])
    base, trial = local_storage.base.rsplit("/", 2)[0], local_storage.base.rsplit("/", 1)[1]
    cfg = make_cfg(
        base, "test", trial, tiny_model_dir,
        use_decoupled_loss=False, loss_agg="seq-mean", adv_estimator="rloo", lr_schedule="cosine",
        warmup_steps=1, c_clip=3.0, eps_clip_higher=0.28, behav_imp_weight_mode="truncate",
        kl_ctl=0.1, kl_estimator="k2", ppo_n_minibatches=2, checkpoint_every=2,
    )  # fmt: skip
    sink = InMemorySink()
    summary = Trainer(cfg, local_storage, metrics=sink).run()
    assert summary.published_versions == [0, 2, 3]  # every 2nd version, and always the last one
    assert sink.values("lr")[0] == pytest.approx(1e-3)  # warmup 1 step: (0 + 1) / 1
    assert sink.values("lr")[2] < sink.values("lr")[1]  # cosine decay
    assert sink.values("behav_weight_mean") == [1.0, 1.0, 1.0]  # decoupled off: prox is behav
    assert all(k > 0 for k in sink.values("kl")) and len(sink.values("kl")) == 3


def test_a_data_timeout_writes_the_resume_point_and_says_so(local_storage, tiny_model_dir: Path) -> None:
    """The rollout side dies after 3 batches: the trainer fails after data_wait_timeout_s, but first writes
    a resume point at v3 (resume_every=10 would not have), so a restart loses no step."""
    base, trial = local_storage.base.rsplit("/", 2)[0], local_storage.base.rsplit("/", 1)[1]
    write_groups(local_storage, [f"g{i}" for i in range(7)])  # 3 batches of 2, and 1 group over
    cfg = make_cfg(base, "test", trial, tiny_model_dir, steps=5, resume_every=10, data_wait_timeout_s=0.5)
    with pytest.raises(TrainerError, match="no new trajectory group") as info:
        Trainer(cfg, local_storage).run()
    assert "train-loop wrote its resume point at version 3" in str(info.value)
    assert list_resume_steps(local_storage) == [3]
    assert CheckpointStore(local_storage).is_done() is None
    write_groups(local_storage, ["g7", "g8", "g9"])  # the rollout is back
    again = Trainer(cfg, local_storage).run()
    assert again.resumed_from == 3 and again.done and again.final_version == 5
    # the group taken into the unfinished 4th batch was not lost: it is trained on after the restart
    assert consumed(local_storage, 5)[3:] == [["g6", "g7"], ["g8", "g9"]]
