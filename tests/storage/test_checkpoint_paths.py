"""Checkpoint readers trust only files inside the trial root that COMMIT.json lists, and a cache only
after rechecking digests (``storage/checkpoint_fetch.py``, ``checkpoint_commit.py``, ``checkpoints.py``).

* a shard index naming a file the checkpoint does not hold (``../x``, ``/abs/x``, or just absent) is
  refused at publish, and at verification if a COMMIT.json lists the index alone;
* a checkpoint file that is a symlink out of the trial root is refused by ``verified_dir`` and
  ``fetch`` (even with identical bytes: the target could change after verification) and by an in-place
  publish;
* a cached copy whose file was rewritten with the same size is fetched again, not reused.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from storage import keys
from storage.checkpoints import CheckpointStore
from storage.errors import CheckpointIntegrityError
from storage.fs import Storage
from storage.transfer import hash_file

INDEX = "model.safetensors.index.json"


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(Storage.open(str(tmp_path / "root"), "exp", "trial"))


def _sharded(d: Path, shard: str, *, with_shard: bool = True) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / INDEX).write_text(json.dumps({"weight_map": {"a.weight": shard, "b.weight": shard}}))
    if with_shard:
        (d / "model-1.safetensors").write_bytes(os.urandom(1024))
    return d


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/tmp/outside.safetensors", "missing.safetensors"],
    ids=["up", "abs", "absent"],
)
def test_publish_refuses_an_index_naming_files_it_does_not_hold(
    store: CheckpointStore, tmp_path: Path, shard: str
) -> None:
    (tmp_path / "outside.safetensors").write_bytes(b"x" * 64)
    src = _sharded(tmp_path / "ck", shard)
    with pytest.raises(CheckpointIntegrityError, match=INDEX.replace(".", r"\.")):
        store.publish(src, 1)
    assert store.list_committed() == []  # nothing committed
    ok = _sharded(tmp_path / "good", "model-1.safetensors")
    assert set(store.publish(ok, 1).files) == {"config.json", INDEX, "model-1.safetensors"}


def test_a_commit_listing_the_index_alone_fails_verification(store: CheckpointStore, tmp_path: Path) -> None:
    storage = store.storage
    ck = storage.local_path(keys.checkpoint_dir(3))
    assert ck is not None
    _sharded(ck, "../../../../outside.safetensors", with_shard=False)
    files = {}
    for name in ("config.json", INDEX):
        d = hash_file(ck / name, "blake3")
        files[name] = {"size": d.size, "blake3": d.digest}
    doc = {
        "format": 2,
        "version": 3,
        "step": 3,
        "hash": "blake3",
        "files": files,
        "meta": {},
        "created_at": 0,
    }
    storage.put_json(keys.checkpoint_commit_key(3), doc, exclusive=True)
    for read in (lambda: store.verified_dir(3, tmp_path / "cache"), lambda: store.fetch(3, tmp_path / "c2")):
        with pytest.raises(CheckpointIntegrityError, match="not a file inside the checkpoint"):
            read()


def test_symlinks_out_of_the_trial_root_are_not_followed(store: CheckpointStore, tmp_path: Path) -> None:
    src = _sharded(tmp_path / "ck", "model-1.safetensors")
    store.publish(src, 1)
    ck = store.storage.local_path(keys.checkpoint_dir(1))
    assert ck is not None
    outside = tmp_path / "outside.safetensors"
    shutil.copy(ck / "model-1.safetensors", outside)  # identical bytes: only the link gives it away
    (ck / "model-1.safetensors").unlink()
    (ck / "model-1.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointIntegrityError, match="symlink out of the trial root"):
        store.verified_dir(1, tmp_path / "cache")
    with pytest.raises(CheckpointIntegrityError, match="symlink out of the trial root"):
        store.fetch(1, tmp_path / "cache")
    # committed in place (the trainer's zero-copy path): a link out of the root is refused too
    staging = store.staging_dir(2)
    assert staging is not None
    _sharded(staging / "x", "model-1.safetensors")
    for p in (staging / "x").iterdir():
        p.rename(staging / p.name)
    (staging / "model-1.safetensors").unlink()
    (staging / "model-1.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointIntegrityError, match="symlink out of the trial root"):
        store.publish(staging, 2)


def test_a_cached_copy_is_reused_only_if_its_digests_match(store: CheckpointStore, tmp_path: Path) -> None:
    src = _sharded(tmp_path / "ck", "model-1.safetensors")
    want = (src / "model-1.safetensors").read_bytes()
    store.publish(src, 1)
    cache = tmp_path / "cache"
    out = store.fetch(1, cache)
    cached = out / "model-1.safetensors"
    cached.write_bytes(bytes(b ^ 0xFF for b in want))  # same size, other bytes
    assert store.fetch(1, cache).joinpath("model-1.safetensors").read_bytes() == want  # fetched again
    (out / "extra.bin").write_bytes(b"planted")
    assert not (store.fetch(1, cache) / "extra.bin").exists()  # a file COMMIT.json does not list: refetched
    assert store.fetch(1, cache) == out  # and an intact copy is reused
