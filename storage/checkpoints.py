"""`CheckpointStore`: publish, resolve, fetch (verified), acknowledge and garbage-collect HF checkpoints.

Protocol for version N (keys in `storage.keys`):

1. every file of the save_pretrained dir goes to `checkpoints/v{N:06d}/...`, hashed on the way;
2. `COMMIT.json` ({format, version, step, files: {name: {size, sha256}}, meta, created_at}) is written
   LAST with an exclusive put: the checkpoint exists iff COMMIT.json does;
3. `checkpoints/LATEST` ({"version": N, "path": uri}) is replaced, unless it already names a newer version.

Readers never see a half-written checkpoint: `resolve_latest` returns only committed versions (falling
back to the newest committed one, with a warning, if LATEST names an uncommitted version), and `fetch`
verifies the size and sha256 of every file into a temp dir that is renamed into the cache only when all
files match. Servers `ack(N, server_id)` the version they serve.

GC rule: keep the newest `keep_last` committed versions, and never delete a version >= the oldest
version a live server serves, where that floor is min over servers of each server's latest ack (acks
older than `ack_ttl_s` are treated as dead servers, if a ttl is set). Deletion removes COMMIT.json first,
so a version is never committed-but-partial.

What this is NOT: a model loader (transformers does that) or a weight-update driver (the watcher is).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage import keys
from storage.errors import (
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    CommitConflictError,
    StorageError,
)
from storage.fs import TMP_MARKER, Storage
from storage.transfer import FileDigest, hash_file

logger = logging.getLogger(__name__)

COMMIT_FORMAT = 1
VERIFIED_MARKER = ".rollflow-verified.json"
_COMMIT_RE = re.compile(r"^checkpoints/v(\d{6,})/COMMIT\.json$")
_ACK_RE = re.compile(r"^checkpoints/v(\d{6,})/acks/([^/]+)\.json$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class CheckpointRef:
    """A committed checkpoint: where it is and what COMMIT.json says it holds."""

    version: int
    step: int | None
    uri: str  # checkpoint dir URI (absolute path on posix), no credentials
    files: dict[str, dict[str, Any]]  # relative name -> {"size": int, "sha256": hex}
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)


def _parse_commit(raw: bytes, version: int) -> dict[str, Any]:
    """Validate COMMIT.json; CheckpointIntegrityError naming COMMIT.json if it is malformed."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != version or not isinstance(doc.get("files"), dict):
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"malformed for version {version}")
    for name, info in doc["files"].items():
        ok = (
            isinstance(info, dict)
            and isinstance(info.get("size"), int)
            and isinstance(info.get("sha256"), str)
            and _SHA256_RE.match(info["sha256"])
        )
        parts = name.split("/")
        if not ok or any(p in ("", ".", "..") for p in parts):
            raise CheckpointIntegrityError(name, "bad entry in COMMIT.json")
    return doc


def _local_files(local_dir: Path) -> list[str]:
    """Relative '/'-separated names of the regular files under `local_dir`, skipping temp files."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(local_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for n in filenames:
            if TMP_MARKER in n or n == VERIFIED_MARKER:
                continue
            out.append(Path(dirpath, n).relative_to(local_dir).as_posix())
    return sorted(out)


class CheckpointStore:
    """Checkpoints of one trial on a `Storage`."""

    def __init__(self, storage: Storage, *, ack_ttl_s: float | None = None, max_workers: int = 4) -> None:
        self.storage = storage
        self.ack_ttl_s = ack_ttl_s
        self.max_workers = max_workers

    # --- publish ------------------------------------------------------------------------------------------

    def staging_dir(self, version: int) -> Path | None:
        """On a posix root: the final dir of `version`, for `save_pretrained` to write into directly
        (zero-copy publish; invisible until COMMIT.json). Leftovers of a crashed attempt are removed.
        On S3: None (save to a local temp dir and `publish` it).
        """
        if not self.storage.is_local:
            return None
        if self.storage.exists(keys.checkpoint_commit_key(version)):
            raise CommitConflictError(f"checkpoint v{version:06d} is already committed")
        path = self.storage.local_path(keys.checkpoint_dir(version))
        assert path is not None
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def publish(
        self,
        local_dir: str | Path,
        version: int,
        *,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> CheckpointRef:
        """Upload every file of `local_dir`, then COMMIT.json, then replace LATEST. Idempotent.

        Re-publishing identical files is a no-op; different files for a committed version raise
        CommitConflictError. LATEST never moves backwards (publishing an older version leaves it).
        """
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise StorageError(f"checkpoint dir {local_dir} does not exist")
        names = _local_files(local_dir)
        if not names:
            raise StorageError(f"checkpoint dir {local_dir} is empty")
        for n in names:
            if n == keys.CHECKPOINT_COMMIT_NAME or n.startswith("acks/"):
                raise StorageError(f"checkpoint dir holds reserved name {n!r}")
        ck_dir = keys.checkpoint_dir(version)
        commit_key = keys.checkpoint_commit_key(version)
        if self.storage.exists(commit_key):
            existing = _parse_commit(self.storage.get_bytes(commit_key), version)
            self._check_same(existing, self._hash_local(local_dir, names), version)
            logger.info("checkpoint v%06d already committed with the same files", version)
            self._advance_latest(version)
            return self._ref(existing)

        t0 = time.perf_counter()
        in_place = self.storage.local_path(ck_dir)
        if in_place is not None and in_place.resolve() == local_dir.resolve():
            digests = self._hash_local(local_dir, names)
        else:
            digests = self._upload(local_dir, names, ck_dir)
        files = {n: {"size": d.size, "sha256": d.sha256} for n, d in sorted(digests.items())}
        doc = {
            "format": COMMIT_FORMAT,
            "version": version,
            "step": step,
            "files": files,
            "meta": meta or {},
            "created_at": time.time(),
        }
        try:
            self.storage.put_json(commit_key, doc, exclusive=True)
        except CommitConflictError:  # a concurrent or retried publish got there first
            existing = _parse_commit(self.storage.get_bytes(commit_key), version)
            self._check_same(existing, digests, version)
            doc = existing
        self._advance_latest(version)
        size = sum(f["size"] for f in files.values())
        logger.info(
            "published checkpoint v%06d: %d files, %.1f MiB in %.2fs",
            version,
            len(files),
            size / 2**20,
            time.perf_counter() - t0,
        )
        return self._ref(doc)

    def _hash_local(self, local_dir: Path, names: list[str]) -> dict[str, FileDigest]:
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return dict(zip(names, pool.map(lambda n: hash_file(local_dir / n), names), strict=True))

    def _upload(self, local_dir: Path, names: list[str], ck_dir: str) -> dict[str, FileDigest]:
        biggest_first = sorted(names, key=lambda n: -(local_dir / n).stat().st_size)
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            futures = {
                n: pool.submit(self.storage.put_file, local_dir / n, f"{ck_dir}/{n}") for n in biggest_first
            }
            return {n: f.result() for n, f in futures.items()}

    @staticmethod
    def _check_same(existing: dict[str, Any], digests: dict[str, FileDigest], version: int) -> None:
        ours = {n: {"size": d.size, "sha256": d.sha256} for n, d in digests.items()}
        theirs = {n: {"size": f["size"], "sha256": f["sha256"]} for n, f in existing["files"].items()}
        if ours != theirs:
            raise CommitConflictError(
                f"checkpoint v{version:06d} is already committed with different files; versions are immutable"
            )

    def _advance_latest(self, version: int) -> None:
        try:
            current = self.storage.get_json(keys.LATEST_KEY)
            cur_v = int(current["version"])
        except FileNotFoundError:
            cur_v = -1
        except (ValueError, KeyError, TypeError):
            logger.warning("checkpoints/LATEST is malformed; replacing it")
            cur_v = -1
        if cur_v > version:
            logger.warning("not moving LATEST back from v%06d to v%06d", cur_v, version)
            return
        if cur_v == version:
            return
        self.storage.put_json(
            keys.LATEST_KEY, {"version": version, "path": self.storage.uri(keys.checkpoint_dir(version))}
        )

    # --- resolve ------------------------------------------------------------------------------------------

    def _ref(self, doc: dict[str, Any]) -> CheckpointRef:
        v = int(doc["version"])
        return CheckpointRef(
            version=v,
            step=doc.get("step"),
            uri=self.storage.uri(keys.checkpoint_dir(v)),
            files={n: dict(f) for n, f in doc["files"].items()},
            created_at=float(doc.get("created_at", 0.0)),
            meta=dict(doc.get("meta") or {}),
        )

    def get(self, version: int) -> CheckpointRef:
        """The committed checkpoint `version`; CheckpointNotFoundError if it has no COMMIT.json."""
        try:
            raw = self.storage.get_bytes(keys.checkpoint_commit_key(version))
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no committed checkpoint v{version:06d}") from None
        return self._ref(_parse_commit(raw, version))

    def list_committed(self) -> list[int]:
        """Versions that have a COMMIT.json, ascending."""
        out = []
        for k in self.storage.list(keys.CHECKPOINT_DIR):
            m = _COMMIT_RE.match(k)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def resolve_latest(self) -> CheckpointRef | None:
        """The checkpoint LATEST names if it is committed; else the newest committed one (warning); else None."""
        try:
            latest = self.storage.get_json(keys.LATEST_KEY)
            v = int(latest["version"])
        except FileNotFoundError:
            v = None
        except (ValueError, KeyError, TypeError):
            logger.warning("checkpoints/LATEST is malformed; using the newest committed version")
            v = None
        if v is not None:
            try:
                return self.get(v)
            except CheckpointNotFoundError:
                logger.warning("LATEST names v%06d, which has no COMMIT.json; falling back", v)
        committed = self.list_committed()
        return self.get(committed[-1]) if committed else None

    # --- fetch --------------------------------------------------------------------------------------------

    def fetch(self, version: int, cache_dir: str | Path) -> Path:
        """Download `version` into `cache_dir/v{N:06d}`, verifying size + sha256 of every file.

        Reuses the cache dir when its verified marker matches COMMIT.json. Files go to a temp dir that
        is renamed into place only after all verify, so a half-downloaded dir is never returned.
        Raises CheckpointNotFoundError (not committed) or CheckpointIntegrityError (naming the file).
        """
        commit_key = keys.checkpoint_commit_key(version)
        try:
            raw = self.storage.get_bytes(commit_key)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no committed checkpoint v{version:06d}") from None
        doc = _parse_commit(raw, version)
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
            names = sorted(doc["files"], key=lambda n: -doc["files"][n]["size"])
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                futs = [
                    pool.submit(self._fetch_one, f"{ck_dir}/{n}", tmp / n, n, doc["files"][n]) for n in names
                ]
                for f in futs:
                    f.result()
            (tmp / VERIFIED_MARKER).write_text(json.dumps({"version": version, "commit_sha256": commit_sha}))
            self._install(tmp, dest, doc, commit_sha)
            logger.info("fetched checkpoint v%06d into %s in %.2fs", version, dest, time.perf_counter() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _fetch_one(self, key: str, target: Path, name: str, expect: dict[str, Any]) -> None:
        # Always a real copy: a hard link would let anyone writing into the cache corrupt the store.
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest = self.storage.get_file(key, target, size=expect["size"])
        except FileNotFoundError:
            raise CheckpointIntegrityError(name, "missing from storage") from None
        if digest.size != expect["size"]:
            raise CheckpointIntegrityError(name, f"size {digest.size} != {expect['size']} in COMMIT.json")
        if digest.sha256 != expect["sha256"]:
            raise CheckpointIntegrityError(
                name, f"sha256 {digest.sha256[:16]}... != {expect['sha256'][:16]}... in COMMIT.json"
            )

    @staticmethod
    def _cache_ok(dest: Path, doc: dict[str, Any], commit_sha: str) -> bool:
        try:
            marker = json.loads((dest / VERIFIED_MARKER).read_text())
        except (OSError, ValueError):
            return False
        if marker.get("commit_sha256") != commit_sha:
            return False
        try:
            return all((dest / n).stat().st_size == f["size"] for n, f in doc["files"].items())
        except OSError:
            return False

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

    def ack(self, version: int, server_id: str) -> None:
        """Record that `server_id` now serves `version`."""
        self.storage.put_json(
            keys.ack_key(version, server_id),
            {"server_id": server_id, "version": version, "acked_at": time.time()},
        )

    def acks(self) -> dict[str, int]:
        """Latest acked version per live server (servers whose latest ack is older than ack_ttl_s are dropped)."""
        latest: dict[str, int] = {}
        for k in self.storage.list(keys.CHECKPOINT_DIR):
            m = _ACK_RE.match(k)
            if m:
                v, server = int(m.group(1)), m.group(2)
                latest[server] = max(v, latest.get(server, -1))
        if self.ack_ttl_s is None:
            return latest
        now = time.time()
        live: dict[str, int] = {}
        for server, v in latest.items():
            try:
                acked_at = float(self.storage.get_json(keys.ack_key(v, server))["acked_at"])
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue
            if now - acked_at <= self.ack_ttl_s:
                live[server] = v
        return live

    def gc(self, keep_last: int) -> list[int]:
        """Delete old versions per the GC rule (module docstring); returns the deleted versions.

        Also removes uncommitted (abandoned) version dirs older than every kept version.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        committed = self.list_committed()
        if not committed:
            return []
        keep = set(committed[-keep_last:])
        served = self.acks()
        floor = min(served.values()) if served else None
        oldest_kept = min(keep)
        victims = [v for v in committed if v not in keep and (floor is None or v < floor)]
        committed_set = set(committed)
        for d in self.storage.list_dirs(keys.CHECKPOINT_DIR):
            v = keys.parse_version_dir(d)
            if v is not None and v not in committed_set and v < oldest_kept and (floor is None or v < floor):
                victims.append(v)
        for v in sorted(victims):
            self.storage.delete(keys.checkpoint_commit_key(v))  # un-commit first
            self.storage.delete(keys.checkpoint_dir(v), recursive=True)
        if victims:
            logger.info(
                "checkpoint gc: deleted %s (keep_last=%d, served floor=%s)", sorted(victims), keep_last, floor
            )
        return sorted(victims)

    # --- trainer done marker ------------------------------------------------------------------------------

    def mark_done(self, info: dict[str, Any]) -> None:
        """Write trainer/DONE.json: the trainer finished (rollout and servers may stop)."""
        self.storage.put_json(keys.TRAINER_DONE_KEY, {**info, "done_at": time.time()})

    def is_done(self) -> dict[str, Any] | None:
        """The DONE.json document, or None while training goes on."""
        try:
            return self.storage.get_json(keys.TRAINER_DONE_KEY)
        except FileNotFoundError:
            return None
