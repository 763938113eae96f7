"""CheckpointStore: publish/resolve/fetch with verification, LATEST fallback, acks and GC (local + moto S3).

Also the cheaper weight propagation: per-checkpoint hash algorithm (blake3 by default, sha256 commits
still read), digests handed over by a writer that hashed while writing, in-place verification on a
local root (no copy), and the LATEST watch primitives (`subscribe`, `latest_token`, `latest_version`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

import blake3
import pytest

from storage import keys
from storage.checkpoints import VERIFIED_MARKER, CheckpointStore
from storage.errors import CheckpointIntegrityError, CheckpointNotFoundError, CommitConflictError
from storage.fs import Storage
from storage.transfer import FileDigest


def _digest(algo: str, data: bytes) -> str:
    """Independent of storage.transfer: the libraries themselves."""
    return hashlib.sha256(data).hexdigest() if algo == "sha256" else blake3.blake3(data).hexdigest()


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
    want = _digest("blake3", (src / "model.safetensors").read_bytes())
    assert ref.hash_algo == "blake3"  # the default
    assert ref.files["model.safetensors"] == {"size": 64 * 1024 + 1, "blake3": want}
    commit = storage.get_json(keys.checkpoint_commit_key(1))
    assert (commit["format"], commit["hash"]) == (2, "blake3")
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
    monkeypatch.setattr("storage.checkpoint_fetch.copy_file_hashed", no_download)  # a posix root's copy
    assert store.fetch(1, tmp_path / "cache") == first
    monkeypatch.undo()
    (first / "config.json").write_text("changed size!")  # a tampered cache is not reused...
    again = store.fetch(1, tmp_path / "cache")
    assert json.loads((again / "config.json").read_text()) == {"seed": 0}
    # ...and writing into the cache never reaches the store (no hard links)
    assert json.loads(storage.get_bytes(f"{keys.checkpoint_dir(1)}/config.json")) == {"seed": 0}


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_fetch_detects_missing_or_corrupt_file(
    storage: Storage, tmp_path: Path, damage: str, algo: str
) -> None:
    store = CheckpointStore(storage, hash_algo=algo)
    store.publish(_ckpt_dir(tmp_path), 3)
    key = f"{keys.checkpoint_dir(3)}/model.safetensors"
    if damage == "missing":
        storage.delete(key)
    else:
        # same size, different bytes (written as a new object, like a bad upload would be)
        data = bytearray(storage.get_bytes(key))
        data[100] ^= 1
        storage.put_bytes(key, bytes(data))
    for verify in (store.fetch, store.verified_dir):  # a copy, or in place on a local root
        with pytest.raises(CheckpointIntegrityError) as e:
            verify(3, tmp_path / "cache")
        assert e.value.file == "model.safetensors"
        assert ("missing" if damage == "missing" else algo) in str(e.value)
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
    from rollflow.models.random_llama import random_llama

    model = random_llama(vocab_size=64, num_hidden_layers=2, max_position_embeddings=64)
    model.save_pretrained(tmp_path / "save")
    store = CheckpointStore(storage)
    store.publish(tmp_path / "save", 1)
    out = store.fetch(1, tmp_path / "cache")
    assert (out / VERIFIED_MARKER).exists()
    loaded = transformers.LlamaForCausalLM.from_pretrained(out)
    for (n, p), (_, q) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(p, q), n


# --- cheaper weight propagation -----------------------------------------------------------------------------


def test_verified_dir_checks_in_place_on_a_local_root_and_downloads_on_s3(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(storage)
    src = _ckpt_dir(tmp_path)
    store.publish(src, 1)
    if storage.is_local:

        def no_copy(*a, **k):
            raise AssertionError("a local root is verified in place, never copied")

        monkeypatch.setattr(storage, "get_file", no_copy)
    out = store.verified_dir(1, tmp_path / "cache")
    if storage.is_local:
        assert out == storage.local_path(keys.checkpoint_dir(1))
        assert not (tmp_path / "cache").exists()  # nothing was written into the cache
    else:
        assert out == tmp_path / "cache" / "v000001"
    for name in ("config.json", "model.safetensors", "tok/tokenizer.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()


def test_verified_dir_refuses_a_file_commit_json_does_not_list(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt_dir(tmp_path), 1)
    # an unverified shard index would make a loader read files no digest covers
    storage.put_bytes(f"{keys.checkpoint_dir(1)}/model.safetensors.index.json", b"{}")
    if storage.is_local:
        with pytest.raises(CheckpointIntegrityError, match="not listed") as e:
            store.verified_dir(1, tmp_path / "cache")
        assert e.value.file == "model.safetensors.index.json"
    else:  # the download takes only what COMMIT.json lists
        out = store.verified_dir(1, tmp_path / "cache")
        assert not (out / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
def test_tampered_file_is_refused_in_place_with_either_algorithm(
    storage: Storage, tmp_path: Path, algo: str
) -> None:
    store = CheckpointStore(storage, hash_algo=algo)
    store.publish(_ckpt_dir(tmp_path), 2)
    ok = store.verified_dir(2, tmp_path / "cache")
    assert (ok / "model.safetensors").is_file()
    key = f"{keys.checkpoint_dir(2)}/config.json"
    data = bytearray(storage.get_bytes(key))
    data[0] ^= 1  # same size: only the digest can tell
    path = storage.local_path(key)
    if path is not None:
        path.write_bytes(bytes(data))  # in place, as a faulty disk or a stray writer would
    else:
        storage.put_bytes(key, bytes(data))
    with pytest.raises(CheckpointIntegrityError, match=algo) as e:
        store.verified_dir(2, tmp_path / "cache2")
    assert e.value.file == "config.json"


def test_format_1_sha256_commits_still_verify(storage: Storage, tmp_path: Path) -> None:
    """COMMIT.json written before the "hash" field existed: sha256 digests under "sha256"."""
    src = _ckpt_dir(tmp_path)
    ck = keys.checkpoint_dir(7)
    files = {}
    for name in ("config.json", "model.safetensors", "tok/tokenizer.json"):
        data = (src / name).read_bytes()
        storage.put_bytes(f"{ck}/{name}", data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    doc = {"format": 1, "version": 7, "step": 70, "files": files, "meta": {}, "created_at": 1.0}
    storage.put_json(keys.checkpoint_commit_key(7), doc, exclusive=True)
    storage.put_json(keys.LATEST_KEY, {"version": 7, "path": storage.uri(ck)})
    store = CheckpointStore(storage)  # writes blake3 itself, reads both
    ref = store.resolve_latest()
    assert ref is not None and ref.version == 7 and ref.hash_algo == "sha256"
    for verify in (store.fetch, store.verified_dir):
        out = verify(7, tmp_path / "cache")
        assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert store.publish(src, 7).hash_algo == "sha256"  # an idempotent re-publish compares in sha256
    storage.put_bytes(f"{ck}/model.safetensors", b"x" * files["model.safetensors"]["size"])
    with pytest.raises(CheckpointIntegrityError, match="sha256"):
        store.verified_dir(7, tmp_path / "cache3")


def test_unknown_hash_algorithm_is_refused(storage: Storage, tmp_path: Path) -> None:
    storage.put_bytes(f"{keys.checkpoint_dir(1)}/config.json", b"{}")
    doc = {"format": 2, "version": 1, "hash": "md5", "files": {"config.json": {"size": 2, "md5": "0" * 64}}}
    storage.put_json(keys.checkpoint_commit_key(1), doc)
    with pytest.raises(CheckpointIntegrityError, match="unknown hash algorithm"):
        CheckpointStore(storage).verified_dir(1, tmp_path / "cache")
    with pytest.raises(ValueError, match="hash_algo"):
        CheckpointStore(storage, hash_algo="md5")


def test_publish_uses_digests_hashed_while_writing(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import storage.checkpoints as ck

    store = CheckpointStore(storage)
    src = store.staging_dir(1) or tmp_path / "staging"
    src.mkdir(parents=True, exist_ok=True)
    weights = os.urandom(100_000)
    (src / "model.safetensors").write_bytes(weights)
    (src / "config.json").write_text("{}")
    given = {"model.safetensors": FileDigest(len(weights), _digest("blake3", weights), "blake3")}
    hashed: list[str] = []
    real = ck.hash_file
    monkeypatch.setattr(
        ck, "hash_file", lambda p, algo="sha256": hashed.append(Path(p).name) or real(p, algo)
    )
    ref = store.publish(src, 1, digests=given)
    assert ref.files["model.safetensors"] == {
        "size": len(weights),
        "blake3": given["model.safetensors"].digest,
    }
    if storage.is_local:  # in place: the weights are not read again, the small config is
        assert hashed == ["config.json"]
    # a digest that does not match what reaches storage is an error, not a commit
    store2 = CheckpointStore(storage)
    bad = {"model.safetensors": FileDigest(len(weights), "0" * 64, "blake3")}
    src2 = store2.staging_dir(2) or tmp_path / "staging2"
    src2.mkdir(parents=True, exist_ok=True)
    (src2 / "model.safetensors").write_bytes(weights)
    if storage.is_local:
        ref2 = store2.publish(src2, 2, digests=bad)  # trusted as handed over (the writer hashed it)...
        with pytest.raises(CheckpointIntegrityError):  # ...and the first load refuses it
            store2.verified_dir(2, tmp_path / "c")
        assert ref2.files["model.safetensors"]["blake3"] == "0" * 64
    else:
        from storage.errors import StorageError

        with pytest.raises(StorageError, match="changed between writing and upload"):
            store2.publish(src2, 2, digests=bad)
        assert store2.list_committed() == [1]


def test_subscribe_wakes_on_a_publish_in_this_process(storage_spec, tmp_path: Path) -> None:
    storage = storage_spec.open()
    store = CheckpointStore(storage)
    other = CheckpointStore(storage_spec.open())  # another store (and Storage) on the same trial
    woken = other.subscribe()
    token = store.latest_token()
    assert store.latest_version() is None
    src = _ckpt_dir(tmp_path)
    store.publish(src, 1)
    assert woken.is_set()  # set synchronously by publish: no polling involved
    assert store.latest_version() == 1
    if storage.is_local:
        assert token == (0, 0, 0) and store.latest_token() != token  # one stat tells LATEST changed
    else:
        assert token is None and store.latest_token() is None  # no cheap stat on S3
    woken.clear()
    store.publish(src, 1)  # idempotent re-publish: LATEST unchanged, nobody woken
    assert not woken.is_set()


def test_gc_keeps_a_version_acked_as_loading(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    src = _ckpt_dir(tmp_path)
    for v in (1, 2, 3):
        store.publish(src, v)
    store.ack(2, "server-a", state="loading")  # a fresh server's watcher is about to load v2
    assert store.gc(keep_last=1) == [1]  # floor 2 keeps v2 although only v3 is "kept"
    store.retract_ack(2, "server-a")  # the load failed
    assert store.gc(keep_last=1) == [2]


def test_gc_keeps_a_version_acked_after_it_computed_the_floor(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(storage)
    src = _ckpt_dir(tmp_path)
    for v in (1, 2, 3):
        store.publish(src, v)
    real = storage.list_dirs

    def list_dirs_then_ack(prefix: str) -> list[str]:
        out = real(prefix)
        store.ack(2, "late", state="loading")  # lands between the floor and the deletes
        return out

    monkeypatch.setattr(storage, "list_dirs", list_dirs_then_ack)
    assert store.gc(keep_last=1) == [1]
    assert store.list_committed() == [2, 3]


def test_latest_is_seen_by_a_waiting_thread(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    woken = store.subscribe()
    seen: list[int | None] = []

    def wait() -> None:
        if woken.wait(30):
            seen.append(store.latest_version())

    t = threading.Thread(target=wait)
    t.start()
    store.publish(_ckpt_dir(tmp_path), 4)
    t.join(30)
    assert seen == [4]
