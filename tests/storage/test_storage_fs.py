"""Storage: puts, gets, listing, exclusive puts, file transfers and credential hygiene (local + moto S3)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from storage.errors import CommitConflictError, StorageError
from storage.fs import Storage


def test_bytes_json_round_trip(storage: Storage) -> None:
    storage.put_bytes("a/b/c.bin", b"\x00\x01payload")
    assert storage.get_bytes("a/b/c.bin") == b"\x00\x01payload"
    storage.put_bytes("a/b/c.bin", b"v2")  # plain put replaces
    assert storage.get_bytes("a/b/c.bin") == b"v2"
    storage.put_json("x.json", {"k": [1, 2], "s": "é"})
    assert storage.get_json("x.json") == {"k": [1, 2], "s": "é"}
    assert storage.exists("x.json") and not storage.exists("nope.json")
    assert storage.size("a/b/c.bin") == 2
    with pytest.raises(FileNotFoundError):
        storage.get_bytes("nope.json")


def test_list_and_list_dirs(storage: Storage) -> None:
    for k in ["d/v000002/b.json", "d/v000001/a.json", "d/v000001/z/deep.txt", "d/top.txt", "dx/other"]:
        storage.put_bytes(k, b"1")
    assert storage.list("d") == ["d/top.txt", "d/v000001/a.json", "d/v000001/z/deep.txt", "d/v000002/b.json"]
    assert storage.list("d/v000001") == ["d/v000001/a.json", "d/v000001/z/deep.txt"]
    assert storage.list_dirs("d") == ["d/v000001", "d/v000002"]  # 'dx' is a sibling, not a child
    assert storage.list("absent") == [] and storage.list_dirs("absent") == []
    assert "dx/other" in storage.list("")


def test_delete(storage: Storage) -> None:
    storage.put_bytes("t/1", b"1")
    storage.put_bytes("t/sub/2", b"2")
    storage.delete("t/1")
    storage.delete("t/1")  # absent: fine
    assert storage.list("t") == ["t/sub/2"]
    storage.delete("t", recursive=True)
    assert storage.list("t") == [] and not storage.exists("t/sub/2")


def test_exclusive_put_conflict(storage: Storage) -> None:
    storage.put_bytes("c/rec.json", b"first", exclusive=True)
    with pytest.raises(CommitConflictError):
        storage.put_bytes("c/rec.json", b"second", exclusive=True)
    assert storage.get_bytes("c/rec.json") == b"first"  # the loser changed nothing
    assert storage.list("c") == ["c/rec.json"]  # and left no temp file behind


def test_put_get_file_hashes_on_the_way(storage: Storage, tmp_path: Path) -> None:
    storage.chunk_size = 5 * 2**20  # S3's minimum part size: 12 MiB -> 3 parts, multipart path
    data = os.urandom(12 * 2**20 + 123)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    up = storage.put_file(src, "files/big.bin")
    assert (up.size, up.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    down = storage.get_file("files/big.bin", tmp_path / "out" / "big.bin")
    assert down == up
    assert (tmp_path / "out" / "big.bin").read_bytes() == data
    small = tmp_path / "small.txt"
    small.write_text("hi")
    assert storage.put_file(small, "files/small.txt").sha256 == hashlib.sha256(b"hi").hexdigest()
    assert storage.get_file("files/small.txt", tmp_path / "s.txt").size == 2
    with pytest.raises(FileNotFoundError):
        storage.get_file("files/absent", tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
    assert [p.name for p in tmp_path.iterdir() if ".rollflow-tmp-" in p.name] == []


def test_uri_and_bad_keys(storage: Storage) -> None:
    assert storage.uri("a/b") == storage.root_uri + "/a/b"
    assert storage.root_uri.endswith("/test/" + storage.root_uri.rsplit("/", 1)[-1])
    for bad in ["../x", "a/../b", "a//b", "./a"]:
        with pytest.raises(StorageError):
            storage.put_bytes(bad, b"x")


def test_open_rejects_unknown_option_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="unknown storage option"):
        Storage.open(str(tmp_path), "e", "t", {"bogus": 1})
    with pytest.raises(ValueError, match="invalid experiment"):
        Storage.open(str(tmp_path), "../e", "t")
    with pytest.raises(StorageError, match="unsupported storage scheme"):
        Storage.open("gs://b/p", "e", "t")
    assert Storage.open(f"file://{tmp_path}", "e", "t").root_uri == str(tmp_path.resolve() / "e" / "t")


SECRET_KEY = "AKIAROLLFLOWKEY123"
SECRET = "s3cr3t-Do-Not-Leak-9f8e7d"


@pytest.mark.s3
def test_credentials_never_in_repr_logs_or_errors(
    s3_server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto accepts any credentials, so distinctive ones exercise the real code path.
    opts = {**s3_server.options, "key": SECRET_KEY, "secret": SECRET}
    caplog.set_level(logging.DEBUG)
    st = Storage.open(f"s3://{s3_server.bucket}/creds", "e", "t", opts)
    st.put_json("k.json", {"a": 1})
    assert st.get_json("k.json") == {"a": 1}
    st.list("")
    for text in (repr(st), str(st), st.root_uri, st.uri("k.json"), caplog.text):
        assert SECRET not in text and SECRET_KEY not in text

    # An error whose text carries a secret (as some S3 servers echo the access key) is scrubbed.
    def leaky(*args, **kwargs):
        raise OSError(f"AccessDenied for key {SECRET_KEY} / {SECRET}")

    monkeypatch.setattr(st.fs, "cat_file", leaky)
    with pytest.raises(OSError) as info:
        st.get_bytes("k.json")
    chain = []
    e: BaseException | None = info.value
    while e is not None:
        chain += [str(e), repr(e)]
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    assert SECRET not in " ".join(chain) and SECRET_KEY not in " ".join(chain)
    assert "***" in str(info.value)

    # user:password in the endpoint never shows either.
    ep = s3_server.endpoint_url.replace("http://", "http://user:pw-Secret-123@")
    st2 = Storage.open(f"s3://{s3_server.bucket}/creds", "e", "t", {**opts, "endpoint_url": ep})
    assert "pw-Secret-123" not in repr(st2)
    with pytest.raises(StorageError) as info2:
        Storage.open(f"s3://{SECRET_KEY}:{SECRET}@bucket/p", "e", "t")
    assert SECRET not in str(info2.value)


@pytest.mark.s3
def test_s3_options_from_env(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    st = Storage.open(f"s3://{s3_server.bucket}/env", "e", "t")
    st.put_bytes("x", b"1")
    assert st.get_bytes("x") == b"1"


def test_storage_pickles_for_worker_processes(storage: Storage) -> None:
    import pickle

    storage.put_bytes("p.txt", b"1")
    again = pickle.loads(pickle.dumps(storage))
    assert again.root_uri == storage.root_uri and again.get_bytes("p.txt") == b"1"


def test_fsync_option_local(tmp_path: Path) -> None:
    st = Storage.open(str(tmp_path), "e", "t", {"fsync": True})
    st.put_bytes("a/b", b"durable", exclusive=True)
    st.put_bytes("a/c", b"also")
    assert st.get_bytes("a/b") == b"durable" and st.list("a") == ["a/b", "a/c"]


def test_modified_at_says_when_a_key_was_written(storage: Storage) -> None:
    """What `rollflow ls` reads to tell a running trial from a stopped one (storage/trial_list.py)."""
    import time

    assert storage.modified_at("checkpoints/LATEST") is None  # absent
    before = time.time()
    storage.put_json("checkpoints/LATEST", {"version": 1, "path": "x"})
    written = storage.modified_at("checkpoints/LATEST")
    assert written is not None and before - 5 <= written <= time.time() + 5, (before, written)
