"""A malformed `checkpoints/LATEST` never stalls weight updates or breaks a publish (local + moto S3).

LATEST is one small JSON document anyone with write access can damage. Readers fall back to the newest
committed version and report the problem; the next publish replaces it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from storage import keys
from storage.checkpoints import CheckpointStore, parse_latest
from storage.errors import CheckpointIntegrityError
from storage.fs import Storage

BAD_LATEST = {
    "minus-one": b'{"version": -1, "path": "x"}',
    "infinity": b"Infinity",
    "version-infinity": b'{"version": Infinity}',
    "float": b'{"version": 1e9}',
    "bool": b'{"version": true}',
    "string": b'{"version": "3"}',
    "junk": b"\x00\xffjunk",
    "empty": b"",
    "list": b"[1]",
    "deep": b"[" * 100_000 + b"]" * 100_000,
}


def _ckpt(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(f'{{"name": "{name}"}}')
    return d


def test_parse_latest() -> None:
    assert parse_latest(b'{"version": 3, "path": "s3://b/x"}') == 3
    for raw in BAD_LATEST.values():
        with pytest.raises(ValueError):
            parse_latest(raw)


@pytest.mark.parametrize("kind", sorted(BAD_LATEST))
def test_malformed_latest_falls_back_and_publish_replaces_it(
    storage: Storage, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt(tmp_path, "a"), 0)
    store.publish(_ckpt(tmp_path, "b"), 1)
    storage.put_bytes(keys.LATEST_KEY, BAD_LATEST[kind])
    with caplog.at_level(logging.ERROR, logger="storage.checkpoints"):
        ref = store.resolve_latest()
    assert ref is not None and ref.version == 1  # the newest committed version
    assert store.latest_version() is None  # the cheap hint says "unknown", never a bogus number
    problem = store.latest_problem()
    assert problem is not None and keys.LATEST_KEY in problem and "malformed" in problem
    assert any("malformed" in r.message for r in caplog.records if r.levelno == logging.ERROR)
    store.publish(_ckpt(tmp_path, "c"), 2)  # publishing over it works (it used to raise after COMMIT.json)
    assert storage.get_json(keys.LATEST_KEY)["version"] == 2
    assert store.resolve_latest().version == 2 and store.latest_problem() is None  # type: ignore[union-attr]


def test_latest_naming_an_uncommitted_future_version_is_replaced(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt(tmp_path, "a"), 0)
    storage.put_json(keys.LATEST_KEY, {"version": 10**12, "path": "nowhere"})
    assert store.resolve_latest().version == 0  # type: ignore[union-attr]
    store.publish(_ckpt(tmp_path, "b"), 1)  # LATEST never moves back, but this one names nothing
    assert store.latest_version() == 1 and store.resolve_latest().version == 1  # type: ignore[union-attr]


def test_deeply_nested_commit_json_is_a_named_integrity_error(storage: Storage, tmp_path: Path) -> None:
    store = CheckpointStore(storage)
    store.publish(_ckpt(tmp_path, "a"), 0)
    storage.put_bytes(keys.checkpoint_commit_key(0), b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(CheckpointIntegrityError, match="COMMIT.json.*nested too deeply"):
        store.get(0)


@pytest.mark.parametrize("bad", [b"{not json", b"[" * 200_000 + b"]" * 200_000, b'{"format": "other"}'])
def test_unreadable_commit_json_of_latest_falls_back_and_is_reported(
    storage: Storage, tmp_path: Path, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(storage)
    for v, name in enumerate("abc"):
        store.publish(_ckpt(tmp_path, name), v)
    storage.put_bytes(keys.checkpoint_commit_key(2), bad)  # LATEST names v2
    storage.put_bytes(keys.checkpoint_commit_key(1), bad)  # and v1 is damaged too
    with caplog.at_level(logging.ERROR, logger="storage.checkpoints"):
        ref = store.resolve_latest()
    assert ref is not None and ref.version == 0  # the newest commit that reads
    problem = store.latest_problem()
    assert problem is not None and "v000002 (LATEST)" in problem and "v000001" in problem, problem
    assert "using v000000" in problem
    # (counted as distinct messages: in a full suite a handler that an earlier flow test attached can hand
    # caplog each record twice)
    errors = {r.getMessage() for r in caplog.records if r.levelno == logging.ERROR}
    assert errors == {problem}
    n_records = len(caplog.records)
    with caplog.at_level(logging.ERROR, logger="storage.checkpoints"):
        store.resolve_latest()  # the same problem again: not logged again
    assert len(caplog.records) == n_records
    store.publish(_ckpt(tmp_path, "d"), 3)
    assert store.resolve_latest().version == 3 and store.latest_problem() is None  # type: ignore[union-attr]
    storage.put_bytes(keys.checkpoint_commit_key(0), bad)
    storage.put_bytes(keys.checkpoint_commit_key(3), bad)
    assert store.resolve_latest() is None and "no readable commit" in (store.latest_problem() or "")
