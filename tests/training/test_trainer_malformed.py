"""The Trainer meets a schema-valid shard holding a token id outside its vocabulary: quarantined, not a crash.

Before the reader checked ids against the vocabulary, such a shard raised IndexError in the embedding on
every attempt, so the trainer crashed again after each restart.
"""

from __future__ import annotations

import random
from pathlib import Path

from helpers import make_group, write_groups
from test_trainer import consumed, make_cfg

from rollflow.training.trainer import Trainer
from storage import keys
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
