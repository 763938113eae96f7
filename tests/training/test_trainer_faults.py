"""The Trainer on S3 through a fault-injecting proxy: every group trained on exactly once, and every
write it makes (checkpoints, COMMIT.json, LATEST, resume points, audit records) survives retries.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from faultproxy import FaultProxy
from helpers import write_groups
from test_trainer import consumed, make_cfg

from rollflow.training.resume import list_resume_steps
from rollflow.training.trainer import Trainer
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def test_trainer_under_storage_faults_trains_on_each_group_once(
    s3_server, tiny_model_dir: Path, tmp_path: Path
) -> None:
    root, trial = f"s3://{s3_server.bucket}/faults", f"t-{uuid.uuid4().hex[:12]}"
    direct = Storage.open(root, "test", trial, s3_server.options)
    write_groups(direct, [f"g{i:02d}" for i in range(7)], per_shard=2)
    rates = {"503": 0.05, "500-after": 0.05, "reset": 0.03, "reset-after": 0.05, "slow": 0.03}
    with FaultProxy(s3_server.endpoint_url, seed=7, rates=rates, slow_s=0.05) as proxy:
        options = {**s3_server.options, "endpoint_url": proxy.url}
        cfg = make_cfg(root, "test", trial, tiny_model_dir, options)
        summary = Trainer(cfg, Storage.open(root, "test", trial, options)).run()
    assert summary.done and summary.steps_run == 3 and summary.quarantined == 0
    assert consumed(direct, 3) == [["g00", "g01"], ["g02", "g03"], ["g04", "g05"]]  # each once, in order
    store = CheckpointStore(direct)
    committed = store.list_committed()  # the oldest may be garbage-collected already
    assert committed[-1] == 3 and store.resolve_latest().version == 3  # type: ignore[union-attr]
    for v in committed:
        store.fetch(v, tmp_path / "cache")  # verifies every file against its COMMIT.json
    assert list_resume_steps(direct) == [2, 3]  # resume_every=2, and at the end
    assert sum(proxy.stats[f] for f in rates) > 0
