"""The Trainer meets a schema-valid shard holding a token id outside its vocabulary: quarantined, not a crash;
a group whose tokens are newer than any published policy: refused and credited, not trained.

Before the reader checked ids against the vocabulary, such a shard raised IndexError in the embedding on
every attempt, so the trainer crashed again after each restart.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import pytest
from helpers import make_group, write_groups
from test_trainer import consumed, make_cfg

from rollflow.training.trainer import Trainer
from storage import credits, keys
from storage.fs import Storage
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter


def test_token_id_outside_vocabulary_is_quarantined_not_a_crash(tmp_path: Path, tiny_model_dir: Path) -> None:
    storage = Storage.open(str(tmp_path / "store"), "test", "t0")
    write_groups(storage, ["g00", "g01"], per_shard=2)
    bad = make_group("bad", rng=random.Random(5))
    bad.rows[1].input_ids[-1] = 2**30  # the tiny model's vocabulary is 40
    with ShardWriter(storage, "hostile", flush_rows=10**6) as w:
        w.add(bad)  # the writer cannot know the vocabulary: schema-valid, committed
    write_groups(storage, ["g02", "g03", "g04", "g05"], per_shard=2)
    bad_commit = [r for r in ShardReader(storage).list_commits() if r.writer.startswith("hostile")][0]

    summary = Trainer(make_cfg(str(tmp_path / "store"), "test", "t0", tiny_model_dir), storage).run()

    assert summary.done and summary.steps_run == 3 and summary.quarantined == 1
    assert consumed(storage, 3) == [["g00", "g01"], ["g02", "g03"], ["g04", "g05"]]
    reason = storage.get_json(keys.quarantine_key(bad_commit.commit_id))["reason"]
    assert "token id 1073741824" in reason and "vocabulary [0, 40)" in reason


def test_restart_after_the_newest_commit_json_was_corrupted(tmp_path: Path, tiny_model_dir: Path) -> None:
    """3 steps (the final resume point is at step 3), then the COMMIT.json of v3, the version LATEST names,
    is corrupted. The restarted trainer starts (it used to fail reading LATEST), does not re-publish over
    the damaged v3, and publishes v4 and v5, which readers then resolve."""
    from storage.checkpoints import CheckpointStore

    storage = Storage.open(str(tmp_path / "store"), "test", "t0")
    write_groups(storage, [f"g{i:02d}" for i in range(10)], per_shard=2)
    cfg = make_cfg(str(tmp_path / "store"), "test", "t0", tiny_model_dir)
    assert Trainer(cfg, storage).run().final_version == 3
    storage.put_bytes(keys.checkpoint_commit_key(3), b"{not json")
    store = CheckpointStore(storage)
    assert store.resolve_latest().version == 2  # type: ignore[union-attr]  # readers fall back past v3

    cfg5 = make_cfg(str(tmp_path / "store"), "test", "t0", tiny_model_dir, steps=5)
    summary = Trainer(cfg5, storage).run()

    assert summary.done and summary.final_version == 5 and summary.resumed_from == 3
    assert storage.get_bytes(keys.checkpoint_commit_key(3)) == b"{not json"  # not re-published over
    assert store.resolve_latest().version == 5 and store.latest_problem() is None  # type: ignore[union-attr]
    assert len({g for step in consumed(storage, 5) for g in step}) == 10  # each group trained once


def test_a_group_newer_than_the_published_policy_is_refused_on_read_not_trained(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer without the version ceiling committed a group whose tokens say v9. The trainer publishes
    v0..v3 over its 3 steps, so no served policy ever generated it: it is refused (credited, logged with
    the reason) and the trainer goes on with the groups after it."""
    storage = Storage.open(str(tmp_path / "store"), "test", "t0")
    write_groups(storage, ["g00", "g01"], per_shard=2)
    with ShardWriter(storage, "unchecked", flush_rows=10**6) as w:  # no version_ceiling: committed
        w.add(make_group("future", version=9, rng=random.Random(5)))
    write_groups(storage, ["g02", "g03", "g04", "g05"], per_shard=2)
    future = [r for r in ShardReader(storage).list_commits() if r.writer.startswith("unchecked")][0]

    with caplog.at_level(logging.ERROR, logger="storage.shard_reader"):
        summary = Trainer(make_cfg(str(tmp_path / "store"), "test", "t0", tiny_model_dir), storage).run()

    assert summary.done and summary.steps_run == 3
    assert consumed(storage, 3) == [["g00", "g01"], ["g02", "g03"], ["g04", "g05"]]
    assert storage.get_json(credits.credit_key(future.partition, future.commit_id))["dropped"] == [0]
    # refused at whichever step reached it, when LATEST named v0, v1 or v2
    assert re.search(r"group future .* version 9, but the newest published policy is v[012];", caplog.text)
