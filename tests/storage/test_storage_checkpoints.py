"""CheckpointStore: publish/resolve/fetch with verification, LATEST fallback, acks and GC (local + moto S3)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from storage import keys
from storage.checkpoints import VERIFIED_MARKER, CheckpointStore
from storage.errors import CheckpointIntegrityError, CheckpointNotFoundError, CommitConflictError
from storage.fs import Storage


def _ckpt_dir(root: Path, seed: int = 0) -> Path:
    """A fake save_pretrained dir: config, a 'weights' blob, a nested tokenizer file."""
    d = root / f"ckpt-{seed}"
    (d / "tok").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    (d / "model.safetensors").write_bytes(os.urandom(64 * 1024) + bytes([seed]))
    (d / "tok" / "tokenizer.json").write_text("{}")
    return d


def test_publish_resolve_fetch_round_trip(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    assert store.resolve_latest() is None
    src = _ckpt_dir(tmp_path)
    ref = store.publish(src, 1, step=10, meta={"loss": 0.5})
    want = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    assert ref.files["model.safetensors"] == {"size": 64 * 1024 + 1, "sha256": want}
    assert set(ref.files) == {"config.json", "model.safetensors", "tok/tokenizer.json"}
    assert (ref.version, ref.step, ref.meta) == (1, 10, {"loss": 0.5})
    assert storage.get_json(keys.LATEST_KEY) == {"version": 1, "path": storage.uri("checkpoints/v000001")}
    latest = store.resolve_latest()
    assert latest is not None and latest.version == 1 and latest.uri == ref.uri
    out = store.fetch(1, tmp_path / "cache")
    assert out == tmp_path / "cache" / "v000001"
    for name in ref.files:
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert store.list_committed() == [1]


def test_fetch_reuses_verified_cache(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt_dir(tmp_path), 1)
    first = store.fetch(1, tmp_path / "cache")

    def no_download(*a, **k):
        raise AssertionError("cache hit expected, but a file was downloaded")

    monkeypatch.setattr(storage, "get_file", no_download)
    assert store.fetch(1, tmp_path / "cache") == first
    monkeypatch.undo()
    (first / "config.json").write_text("changed size!")  # a tampered cache is not reused...
    again = store.fetch(1, tmp_path / "cache")
    assert json.loads((again / "config.json").read_text()) == {"seed": 0}
    # ...and writing into the cache never reaches the store (no hard links)
    assert json.loads(storage.get_bytes(f"{keys.checkpoint_dir(1)}/config.json")) == {"seed": 0}


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_fetch_detects_missing_or_corrupt_file(storage: Storage, tmp_path: Path, damage: str) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt_dir(tmp_path), 3)
    key = f"{keys.checkpoint_dir(3)}/model.safetensors"
    if damage == "missing":
        storage.delete(key)
    else:
        # same size, different bytes (written as a new object, like a bad upload would be)
        data = bytearray(storage.get_bytes(key))
        data[100] ^= 1
        storage.put_bytes(key, bytes(data))
    with pytest.raises(CheckpointIntegrityError) as e:
        store.fetch(3, tmp_path / "cache")
    assert e.value.file == "model.safetensors"
    assert ("missing" if damage == "missing" else "sha256") in str(e.value)
    cache = tmp_path / "cache"
    assert list(cache.iterdir()) == []  # no half-downloaded dir, no temp left behind


def test_uncommitted_version_is_never_returned(storage: Storage, tmp_path: Path, caplog) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt_dir(tmp_path, 1), 1)
    store.publish(_ckpt_dir(tmp_path, 2), 2)
    # A crashed publish of v3: files and even LATEST, but no COMMIT.json.
    storage.put_bytes(f"{keys.checkpoint_dir(3)}/model.safetensors", b"half")
    storage.put_json(keys.LATEST_KEY, {"version": 3, "path": "whatever"})
    with caplog.at_level(logging.WARNING, logger="storage"):
        ref = store.resolve_latest()
    assert ref is not None and ref.version == 2
    assert "no COMMIT.json" in caplog.text
    with pytest.raises(CheckpointNotFoundError):
        store.fetch(3, tmp_path / "cache")
    assert store.list_committed() == [1, 2]


def test_publish_is_idempotent_and_versions_immutable(storage: Storage, tmp_path: Path, caplog) -> None:
    store = CheckpointStore(storage)
    src = _ckpt_dir(tmp_path, 0)
    a = store.publish(src, 5)
    b = store.publish(src, 5)  # retry: same files -> same ref, no error
    assert a.files == b.files
    with pytest.raises(CommitConflictError):
        store.publish(_ckpt_dir(tmp_path, 9), 5)
    with caplog.at_level(logging.WARNING, logger="storage"):
        store.publish(_ckpt_dir(tmp_path, 4), 4)  # older version: committed, LATEST stays at 5
    assert storage.get_json(keys.LATEST_KEY)["version"] == 5
    assert "not moving LATEST back" in caplog.text
    assert store.list_committed() == [4, 5]


def test_gc_keeps_last_k_and_what_servers_serve(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    src = _ckpt_dir(tmp_path)
    for v in range(1, 7):
        store.publish(src, v)
    store.ack(2, "server-a")
    store.ack(3, "server-a")  # server-a's latest ack: 3
    store.ack(5, "server-b")
    assert store.acks() == {"server-a": 3, "server-b": 5}
    # keep_last=2 keeps {5, 6}; floor = min(3, 5) = 3 protects 3, 4 -> only 1 and 2 go
    assert store.gc(keep_last=2) == [1, 2]
    assert store.list_committed() == [3, 4, 5, 6]
    assert storage.list(keys.checkpoint_dir(1)) == []
    store.ack(6, "server-a")
    store.ack(6, "server-b")
    # floor 6: everything outside the last 2 may go -> 3, 4
    assert store.gc(keep_last=2) == [3, 4]
    assert store.list_committed() == [5, 6]
    assert store.resolve_latest().version == 6
    with pytest.raises(ValueError):
        store.gc(keep_last=0)


def test_gc_ignores_dead_servers_with_ttl(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage, ack_ttl_s=60)
    src = _ckpt_dir(tmp_path)
    for v in range(1, 5):
        store.publish(src, v)
    store.ack(1, "dead")
    storage.put_json(keys.ack_key(1, "dead"), {"server_id": "dead", "version": 1, "acked_at": 0.0})
    store.ack(2, "alive")
    assert store.acks() == {"alive": 2}
    # keep_last=1 keeps {4}; floor 2 (the dead server's ack at 1 is ignored) -> delete 1
    assert store.gc(keep_last=1) == [1]


def test_gc_removes_abandoned_uncommitted_dirs(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    storage.put_bytes(f"{keys.checkpoint_dir(1)}/model.safetensors", b"crashed publish")
    src = _ckpt_dir(tmp_path)
    for v in (2, 3):
        store.publish(src, v)
    storage.put_bytes(f"{keys.checkpoint_dir(4)}/model.safetensors", b"publish in progress")
    assert store.gc(keep_last=2) == [1]  # v4 (newer than every kept version) is left alone
    assert storage.exists(f"{keys.checkpoint_dir(4)}/model.safetensors")


def test_staging_dir_publishes_in_place(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    staging = store.staging_dir(1)
    if not storage.is_local:
        assert staging is None
        return
    assert staging == storage.local_path(keys.checkpoint_dir(1))
    (staging / "leftover.bin").write_bytes(b"x")
    staging = store.staging_dir(1)  # a crashed attempt's leftovers are cleared
    assert list(staging.iterdir()) == []
    (staging / "config.json").write_text("{}")
    ref = store.publish(staging, 1)
    assert list(ref.files) == ["config.json"]
    with pytest.raises(CommitConflictError):
        store.staging_dir(1)


def test_done_marker(storage: Storage) -> None:
    store = CheckpointStore(storage)
    assert store.is_done() is None
    store.mark_done({"version": 7, "step": 70})
    done = store.is_done()
    assert done is not None and done["version"] == 7 and "done_at" in done


def test_real_hf_checkpoint_round_trip(storage: Storage, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "save")
    store = CheckpointStore(storage)
    store.publish(tmp_path / "save", 1)
    out = store.fetch(1, tmp_path / "cache")
    assert (out / VERIFIED_MARKER).exists()
    loaded = transformers.LlamaForCausalLM.from_pretrained(out)
    for (n, p), (_, q) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(p, q), n
