"""Verifying a committed checkpoint before it is loaded: in place on a local root, or into a cache.

What it is: ``CheckpointFetcher`` checks the size and digest of every file of a version against its
COMMIT.json. ``verify_in_place`` checks a posix root's own directory (nothing is copied; files that
COMMIT.json does not list are refused too, so a loader cannot pick up an unverified file); ``fetch``
downloads into ``cache_dir/v{N:06d}``, hashing on the way (from a posix root: a kernel copy, then the
copy itself hashed), into a temp dir renamed into place only after
every file verified, and reuses a cached copy only after checking every cached file's digest against
COMMIT.json again (a size match says nothing about the bytes: a cache directory may be shared, and a file
rewritten in place keeps its size). Both refuse a file whose real path leaves the trial root (or the cache
directory) through a symlink, and a version whose index names shards COMMIT.json does not list
(``checkpoint_commit.check_needed_files``), before a loader can open it.
What it is not: resolving which version to load (``storage.checkpoints.CheckpointStore``, whose
``verified_dir`` and ``fetch`` call this after reading COMMIT.json).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage import keys
from storage.checkpoint_commit import (
    SHARD_INDEX_NAME,
    VERIFIED_MARKER,
    check_digest,
    check_inside,
    check_needed_files,
    commit_algo,
    inside,
    local_files,
)
from storage.errors import CheckpointIntegrityError, StorageError
from storage.fs import TMP_MARKER, Storage
from storage.transfer import copy_file_hashed, hash_file

logger = logging.getLogger(__name__)
WEIGHTS_SUFFIX = ".safetensors"  # the files a verifying loader hashes itself (``defer_weights``)


class CheckpointFetcher:
    """Verifies (and downloads) versions of one trial's checkpoints, ``max_workers`` files at a time."""

    def __init__(self, storage: Storage, max_workers: int = 4) -> None:
        self.storage = storage
        self.max_workers = max_workers

    def verify_in_place(self, version: int, doc: dict[str, Any], *, defer_weights: bool = False) -> Path:
        """The local directory of ``version`` (posix root), every file checked against ``doc``
        (its COMMIT.json). Raises CheckpointIntegrityError naming the file.

        ``defer_weights``: the ``*.safetensors`` files' sizes are checked, their digests left to a loader
        that checks them as it reads them (``rollflow.models.verified_weights``): one read, not two."""
        path = self.storage.local_path(keys.checkpoint_dir(version))
        root = self.storage.local_path("")
        assert path is not None and root is not None
        t0 = time.perf_counter()
        algo = commit_algo(doc)
        extra = [
            n
            for n in local_files(path)
            if n != keys.CHECKPOINT_COMMIT_NAME and not n.startswith("acks/") and n not in doc["files"]
        ]
        if extra:
            raise CheckpointIntegrityError(extra[0], "not listed in COMMIT.json")

        for name in doc["files"]:  # before anything is read through a link
            check_inside(name, path / name, root)

        def check(name: str) -> None:
            expect = doc["files"][name]
            try:
                if (path / name).stat().st_size != expect["size"]:  # cheap early refusal
                    raise CheckpointIntegrityError(name, f"size differs from {expect['size']} in COMMIT.json")
                if defer_weights and name.endswith(WEIGHTS_SUFFIX):
                    return
                check_digest(name, hash_file(path / name, algo), expect, algo)
            except FileNotFoundError:
                raise CheckpointIntegrityError(name, "missing from storage") from None

        names = sorted(doc["files"], key=lambda n: -doc["files"][n]["size"])
        if len(names) == 1 or self.max_workers == 1:
            for n in names:
                check(n)
        else:
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                for f in [pool.submit(check, n) for n in names]:
                    f.result()
        check_needed_files(doc["files"], _index_bytes(path, doc))
        logger.debug(
            "verified checkpoint v%06d in place (%s) in %.3fs", version, algo, time.perf_counter() - t0
        )
        return path

    def fetch(self, version: int, raw: bytes, doc: dict[str, Any], cache_dir: str | Path) -> Path:
        """Download ``version`` (``raw``: its COMMIT.json bytes, ``doc``: parsed) into
        ``cache_dir/v{N:06d}``, verifying size + digest of every file; reuses a cached copy whose marker
        matches ``raw``. Raises CheckpointIntegrityError naming the file."""
        commit_sha = hashlib.sha256(raw).hexdigest()
        cache_dir = Path(cache_dir)
        dest = cache_dir / keys.version_dir_name(version)
        if self._cache_ok(dest, doc, commit_sha):
            logger.debug("checkpoint v%06d: cache hit %s", version, dest)
            return dest
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f".{dest.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            t0 = time.perf_counter()
            ck_dir = keys.checkpoint_dir(version)
            algo = commit_algo(doc)
            names = sorted(doc["files"], key=lambda n: -doc["files"][n]["size"])
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                futs = [
                    pool.submit(self._fetch_one, f"{ck_dir}/{n}", tmp / n, n, doc["files"][n], algo)
                    for n in names
                ]
                for f in futs:
                    f.result()
            check_needed_files(doc["files"], _index_bytes(tmp, doc))
            (tmp / VERIFIED_MARKER).write_text(json.dumps({"version": version, "commit_sha256": commit_sha}))
            self._install(tmp, dest, doc, commit_sha)
            logger.debug("fetched checkpoint v%06d into %s in %.2fs", version, dest, time.perf_counter() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _fetch_one(self, key: str, target: Path, name: str, expect: dict[str, Any], algo: str) -> None:
        # Always a real copy: a hard link would let anyone writing into the cache corrupt the store.
        target.parent.mkdir(parents=True, exist_ok=True)
        src, root = self.storage.local_path(key), self.storage.local_path("")
        if src is not None and root is not None:
            check_inside(name, src, root)
        try:
            if src is not None:  # a posix root: a kernel copy, then the copy's own bytes hashed
                digest = copy_file_hashed(src, target, algo)
            else:
                digest = self.storage.get_file(key, target, size=expect["size"], algo=algo)
        except FileNotFoundError:
            raise CheckpointIntegrityError(name, "missing from storage") from None
        check_digest(name, digest, expect, algo)

    def _cache_ok(self, dest: Path, doc: dict[str, Any], commit_sha: str) -> bool:
        """True if ``dest`` holds exactly COMMIT.json's files, each with its digest (rehashed now), no
        symlink leaving ``dest``, and a verified marker for this COMMIT.json."""
        try:
            marker = json.loads((dest / VERIFIED_MARKER).read_text())
        except (OSError, ValueError, RecursionError):
            return False
        if not isinstance(marker, dict) or marker.get("commit_sha256") != commit_sha:
            return False
        files, algo = doc["files"], commit_algo(doc)
        if set(local_files(dest)) != set(files) or not all(inside(dest / n, dest) for n in files):
            logger.warning("cached checkpoint %s holds other files than COMMIT.json; fetching again", dest)
            return False

        def same(name: str) -> bool:
            try:
                check_digest(name, hash_file(dest / name, algo), files[name], algo)
                return True
            except (OSError, CheckpointIntegrityError) as e:
                logger.warning("cached checkpoint %s: %s; fetching again", dest, e)
                return False

        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return all(list(pool.map(same, sorted(files, key=lambda n: -files[n]["size"]))))

    def _install(self, tmp: Path, dest: Path, doc: dict[str, Any], commit_sha: str) -> None:
        """Rename the verified temp dir to `dest`, replacing a stale one; tolerate a concurrent fetcher."""
        for _ in range(3):
            try:
                os.rename(tmp, dest)
                return
            except OSError:
                if self._cache_ok(dest, doc, commit_sha):
                    return  # another fetcher installed a verified copy first
                stale = dest.with_name(f".{dest.name}.stale-{uuid.uuid4().hex[:8]}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(dest, stale)
                shutil.rmtree(stale, ignore_errors=True)
        raise StorageError(f"could not install checkpoint into {dest}")

    # --- acks and gc --------------------------------------------------------------------------------------


def _index_bytes(directory: Path, doc: dict[str, Any]) -> bytes | None:
    """The (already verified) shard index of a checkpoint, or None when COMMIT.json lists none."""
    return (directory / SHARD_INDEX_NAME).read_bytes() if SHARD_INDEX_NAME in doc["files"] else None
