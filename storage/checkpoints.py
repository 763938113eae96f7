"""`CheckpointStore`: publish, resolve, verify (in place or into a cache), acknowledge and GC HF checkpoints.

Protocol for version N (keys in `storage.keys`):

1. every file of the save_pretrained dir goes to `checkpoints/v{N:06d}/...`, hashed as it is written
   (the trainer hashes the bytes it serializes and hands the digests to `publish`; otherwise the upload
   or copy hashes on the way);
2. `COMMIT.json` ({format, version, step, hash, files: {name: {size, <hash>}}, meta, created_at}) is
   written LAST with an exclusive put: the checkpoint exists iff COMMIT.json does. `hash` names the
   algorithm ("blake3" by default, "sha256" in format-1 files, which have no `hash` field);
3. `checkpoints/LATEST` ({"version": N, "path": uri}) is replaced, unless it already names a newer
   version, and every watcher in this process that `subscribe`d to the trial is woken.

Readers never see a half-written checkpoint: `resolve_latest` returns only committed versions (falling
back to the newest committed one, with a warning, if LATEST names an uncommitted version). A malformed
LATEST (not JSON, `Infinity`, a version that is not an int >= 0) is an error, never a stall: it is
logged at ERROR, `latest_problem()` says what is wrong (the watcher turns it into an error event),
readers fall back to the newest committed version, and the next publish replaces it. Before
every load the size and digest of every file are checked against COMMIT.json: `verified_dir` checks a
local root's files in place (nothing is copied) and downloads an S3 checkpoint into a cache (hashing
while downloading); `fetch` always makes a verified private copy.

GC rule: keep the newest `keep_last` committed versions, and never delete a version >= the floor, the
minimum over servers of each server's latest ack (acks older than `ack_ttl_s` count as dead servers, if
a ttl is set). An ack is bound to the process that wrote it (its `owner`: host, pid and pid namespace):
an ack whose owner ran here and is no longer running is dead at once, whatever its age (a watcher killed
with its flow, whose servers died with it, holds nothing back after the trial is resumed); an ack from
another host lives until its TTL. A watcher acks N as "loading" BEFORE it verifies or loads N, so the
floor covers what is being loaded, and GC re-checks a victim's acks just before deleting it. Deletion
removes COMMIT.json first, so a version is never committed-but-partial.

A version may hold a LoRA adapter instead of a full model (`train.lora`): `adapter_model.safetensors` +
`adapter_config.json` (peft's format), with `meta.kind = "adapter"` and `meta.base_model` in COMMIT.json.
It is published, verified, acknowledged and collected exactly like a full checkpoint;
`CheckpointRef.is_adapter` tells them apart.

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
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from storage import keys
from storage.errors import (
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    CommitConflictError,
    StorageError,
)
from storage.fs import TMP_MARKER, Storage
from storage.transfer import HASH_ALGOS, FileDigest, default_hash_algo, hash_file

logger = logging.getLogger(__name__)

ADAPTER_CONFIG_NAME = "adapter_config.json"  # a version holding this file is a LoRA adapter (peft's format)
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"  # the adapter's tensors
COMMIT_FORMAT = 2  # 1: sha256 only, no "hash" field; 2: "hash" names the algorithm
VERIFIED_MARKER = ".rollflow-verified.json"
_COMMIT_RE = re.compile(r"^checkpoints/v(\d{6,})/COMMIT\.json$")
_ACK_RE = re.compile(r"^checkpoints/v(\d{6,})/acks/([^/]+)\.json$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")

# In-process wake-ups: trial root URI -> events of the watchers subscribed to it (see `subscribe`).
_WAKE_LOCK = threading.Lock()
_WAKE: dict[str, weakref.WeakSet[threading.Event]] = {}


@dataclass
class CheckpointRef:
    """A committed checkpoint: where it is and what COMMIT.json says it holds."""

    version: int
    step: int | None
    uri: str  # checkpoint dir URI (absolute path on posix), no credentials
    files: dict[str, dict[str, Any]]  # relative name -> {"size": int, <hash_algo>: hex}
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)
    hash_algo: str = "sha256"

    @property
    def is_adapter(self) -> bool:
        """A LoRA adapter (adapter_config.json + adapter_model.safetensors), not a full model directory."""
        return ADAPTER_CONFIG_NAME in self.files


def _parse_commit(raw: bytes, version: int) -> dict[str, Any]:
    """Validate COMMIT.json; CheckpointIntegrityError naming COMMIT.json if it is malformed."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, "JSON nested too deeply") from None
    except ValueError as e:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != version or not isinstance(doc.get("files"), dict):
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"malformed for version {version}")
    algo = _algo(doc)
    if algo not in HASH_ALGOS:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"unknown hash algorithm {algo!r}")
    for name, info in doc["files"].items():
        ok = (
            isinstance(info, dict)
            and isinstance(info.get("size"), int)
            and isinstance(info.get(algo), str)
            and _HEX64_RE.match(info[algo])
        )
        parts = name.split("/")
        if not ok or any(p in ("", ".", "..") for p in parts):
            raise CheckpointIntegrityError(name, "bad entry in COMMIT.json")
    return doc


def parse_latest(raw: bytes) -> int:
    """The version in a LATEST document `{"version": N, "path": ...}`; ValueError saying what is wrong.

    N must be a JSON integer >= 0: `-1`, `Infinity`, `1e9` (a float), `true` and junk are refused.
    """
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:  # also bad UTF-8
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise ValueError('not an object with a "version"')
    v = doc["version"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"version {v!r} is not an integer >= 0")
    return v


def _algo(doc: Mapping[str, Any]) -> str:
    """The digest algorithm of a COMMIT.json document (format 1 predates the field: sha256)."""
    return str(doc.get("hash", "sha256"))


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


def _check_digest(name: str, got: FileDigest, expect: Mapping[str, Any], algo: str) -> None:
    if got.size != expect["size"]:
        raise CheckpointIntegrityError(name, f"size {got.size} != {expect['size']} in COMMIT.json")
    if got.algo != algo or got.digest != expect[algo]:
        raise CheckpointIntegrityError(
            name, f"{algo} {got.digest[:16]}... != {expect[algo][:16]}... in COMMIT.json"
        )


def _pid_space() -> str:
    """This machine's boot and pid namespace: where a pid means this very process (two containers with
    one hostname, or two hosts both called "localhost", never compare pids across each other)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def ack_owner() -> dict[str, Any]:
    """Who writes an ack: this host and process (`_owner_gone` tells when it has ended)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": _pid_space()}


def _owner_gone(owner: Any) -> bool:
    """True when an ack's owner ran here (same host, boot and pid namespace) and its process is gone;
    False when it may be alive or cannot be checked from here (another host, no owner recorded: the
    TTL decides)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return False
    space = _pid_space()
    if not space or owner.get("pid_space") != space:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: a process of another user holds the pid, so it is not ours, and not dead
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet still has a pid; it serves nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


class CheckpointStore:
    """Checkpoints of one trial on a `Storage`. `hash_algo`: what new commits record (default blake3)."""

    def __init__(
        self,
        storage: Storage,
        *,
        ack_ttl_s: float | None = None,
        max_workers: int = 4,
        hash_algo: str | None = None,
    ) -> None:
        self.storage = storage
        self.ack_ttl_s = ack_ttl_s
        self.max_workers = max_workers
        self.hash_algo = hash_algo or default_hash_algo()
        self._latest_problem: str | None = None
        if self.hash_algo not in HASH_ALGOS:
            raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {self.hash_algo!r}")

    # --- publish ------------------------------------------------------------------------------------------

    def staging_dir(self, version: int) -> Path | None:
        """On a posix root: the final dir of `version`, for the trainer to write into directly
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
        digests: Mapping[str, FileDigest] | None = None,
    ) -> CheckpointRef:
        """Upload every file of `local_dir`, then COMMIT.json, then replace LATEST. Idempotent.

        `digests`: size + digest of files the caller hashed while writing them (of `hash_algo`; others
        are ignored). In place on a posix root they are used as they are, so those files are never read
        again; an upload still hashes on the way and must agree with them. Files without one are hashed.
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
        known = {n: d for n, d in (digests or {}).items() if d.algo == self.hash_algo and n in names}
        ck_dir = keys.checkpoint_dir(version)
        commit_key = keys.checkpoint_commit_key(version)
        if self.storage.exists(commit_key):
            existing = _parse_commit(self.storage.get_bytes(commit_key), version)
            self._check_same(existing, local_dir, names, known, version)
            logger.debug("checkpoint v%06d already committed with the same files", version)
            self._advance_latest(version)
            return self._ref(existing)

        t0 = time.perf_counter()
        in_place = self.storage.local_path(ck_dir)
        if in_place is not None and in_place.resolve() == local_dir.resolve():
            found = self._hash_local(local_dir, [n for n in names if n not in known], self.hash_algo)
            found.update({n: known[n] for n in names if n in known})
            for n, d in known.items():  # a cheap guard against a wrong caller: the size must agree
                if (local_dir / n).stat().st_size != d.size:
                    raise StorageError(f"{n}: size on disk differs from the digest handed to publish")
        else:
            found = self._upload(local_dir, names, ck_dir, known)
        files = {n: {"size": d.size, self.hash_algo: d.digest} for n, d in sorted(found.items())}
        doc = {
            "format": COMMIT_FORMAT,
            "version": version,
            "step": step,
            "hash": self.hash_algo,
            "files": files,
            "meta": meta or {},
            "created_at": time.time(),
        }
        try:
            self.storage.put_json(commit_key, doc, exclusive=True)
        except CommitConflictError:  # a concurrent or retried publish got there first
            existing = _parse_commit(self.storage.get_bytes(commit_key), version)
            self._check_same(existing, local_dir, names, found, version)
            doc = existing
        self._advance_latest(version)
        size = sum(f["size"] for f in files.values())
        logger.debug(
            "published checkpoint v%06d: %d files, %.1f MiB in %.2fs",
            version,
            len(files),
            size / 2**20,
            time.perf_counter() - t0,
        )
        return self._ref(doc)

    def _hash_local(self, local_dir: Path, names: list[str], algo: str) -> dict[str, FileDigest]:
        if not names:
            return {}
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return dict(zip(names, pool.map(lambda n: hash_file(local_dir / n, algo), names), strict=True))

    def _upload(
        self, local_dir: Path, names: list[str], ck_dir: str, known: Mapping[str, FileDigest]
    ) -> dict[str, FileDigest]:
        def put(n: str) -> FileDigest:
            d = self.storage.put_file(local_dir / n, f"{ck_dir}/{n}", algo=self.hash_algo)
            if n in known and (known[n].size, known[n].digest) != (d.size, d.digest):
                raise StorageError(f"{n} changed between writing and upload (digest differs)")
            return d

        biggest_first = sorted(names, key=lambda n: -(local_dir / n).stat().st_size)
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            futures = {n: pool.submit(put, n) for n in biggest_first}
            return {n: f.result() for n, f in futures.items()}

    def _check_same(
        self,
        existing: dict[str, Any],
        local_dir: Path,
        names: list[str],
        ours: Mapping[str, FileDigest],
        version: int,
    ) -> None:
        """CommitConflictError unless `local_dir` holds exactly the committed files (in the commit's algo)."""
        algo = _algo(existing)
        have = {n: d for n, d in ours.items() if d.algo == algo}
        have.update(self._hash_local(local_dir, [n for n in names if n not in have], algo))
        mine = {n: (d.size, d.digest) for n, d in have.items()}
        theirs = {n: (f["size"], f[algo]) for n, f in existing["files"].items()}
        if mine != theirs:
            raise CommitConflictError(
                f"checkpoint v{version:06d} is already committed with different files; versions are immutable"
            )

    def _read_latest(self) -> int | None:
        """The version LATEST names, or None if it is absent or malformed (then `latest_problem()` says
        why, and the problem is logged at ERROR once per distinct text).
        """
        v, problem = self._parse_latest_key()
        self._report_problem(None if problem is None else problem + "; using the newest committed version")
        return v

    def _report_problem(self, problem: str | None) -> None:
        """Record what ``latest_problem()`` returns; log it at ERROR when it differs from the last one."""
        if problem is not None and problem != self._latest_problem:
            logger.error("%s", problem)
        self._latest_problem = problem

    def _parse_latest_key(self) -> tuple[int | None, str | None]:
        """(the version LATEST names, None) or (None, why it is malformed); (None, None) if absent."""
        try:
            return parse_latest(self.storage.get_bytes(keys.LATEST_KEY)), None
        except FileNotFoundError:
            return None, None
        except ValueError as e:
            return None, f"{keys.LATEST_KEY} is malformed ({e})"

    def latest_problem(self) -> str | None:
        """What the last read of LATEST had to skip (LATEST malformed, a COMMIT.json unreadable) and
        where it fell back to; None if LATEST was fine or absent."""
        return self._latest_problem

    def _advance_latest(self, version: int) -> None:
        cur_v = self._read_latest()
        if cur_v is None:
            cur_v = -1
        if cur_v > version and not self.storage.exists(keys.checkpoint_commit_key(cur_v)):
            logger.error("checkpoints/LATEST names v%06d, which is not committed; replacing it", cur_v)
            cur_v = -1
        if cur_v > version:
            logger.warning("not moving LATEST back from v%06d to v%06d", cur_v, version)
            return
        if cur_v == version:
            return
        self.storage.put_json(
            keys.LATEST_KEY, {"version": version, "path": self.storage.uri(keys.checkpoint_dir(version))}
        )
        with _WAKE_LOCK:
            waiting = list(_WAKE.get(self.storage.root_uri, ()))
        for ev in waiting:
            ev.set()

    # --- watching LATEST ----------------------------------------------------------------------------------

    def subscribe(self) -> threading.Event:
        """An event that is set whenever this process moves LATEST of this trial forward (from any
        `CheckpointStore` on the same root): the in-process wake-up of a watcher whose trainer runs in
        the same process. Clear it before reading LATEST, then wait on it. Held weakly here.
        """
        ev = threading.Event()
        with _WAKE_LOCK:
            _WAKE.setdefault(self.storage.root_uri, weakref.WeakSet()).add(ev)
        return ev

    def latest_token(self) -> tuple[int, int, int] | None:
        """A cheap fingerprint of LATEST that changes when it is replaced: one stat on a posix root
        ((inode, size, mtime_ns); (0, 0, 0) while absent); None on S3, where a request is not cheap.
        """
        path = self.storage.local_path(keys.LATEST_KEY)
        if path is None:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return (0, 0, 0)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def latest_version(self) -> int | None:
        """The version LATEST names (one small read), committed or not; None if absent or malformed."""
        return self._read_latest()

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
            hash_algo=_algo(doc),
        )

    def _commit_doc(self, version: int) -> tuple[bytes, dict[str, Any]]:
        try:
            raw = self.storage.get_bytes(keys.checkpoint_commit_key(version))
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no committed checkpoint v{version:06d}") from None
        return raw, _parse_commit(raw, version)

    def get(self, version: int) -> CheckpointRef:
        """The committed checkpoint `version`; CheckpointNotFoundError if it has no COMMIT.json."""
        return self._ref(self._commit_doc(version)[1])

    def list_committed(self) -> list[int]:
        """Versions that have a COMMIT.json, ascending."""
        out = []
        for k in self.storage.list(keys.CHECKPOINT_DIR):
            m = _COMMIT_RE.match(k)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def resolve_latest(self) -> CheckpointRef | None:
        """The checkpoint LATEST names if it is committed and its COMMIT.json reads; else the newest
        committed version whose COMMIT.json reads; else None.

        A malformed LATEST or an unreadable COMMIT.json (corrupt, nested too deeply, wrong format) is
        logged at ERROR once per distinct problem and reported by ``latest_problem()`` (the watcher
        makes it an error event); the fallback keeps weight updates going. A LATEST that names an
        uncommitted version only warns (a publish between the two reads).
        """
        v, malformed = self._parse_latest_key()
        problems = [malformed] if malformed else []
        if v is not None:
            try:
                return self._resolved(self.get(v), problems)
            except CheckpointNotFoundError:
                logger.warning("LATEST names v%06d, which has no COMMIT.json; falling back", v)
            except CheckpointIntegrityError as e:
                problems.append(f"v{v:06d} (LATEST): {e}")
        for c in reversed(self.list_committed()):
            if c == v:
                continue  # LATEST's own version: tried above
            try:
                return self._resolved(self.get(c), problems)
            except CheckpointNotFoundError:  # collected between the LIST and the read
                continue
            except CheckpointIntegrityError as e:
                problems.append(f"v{c:06d}: {e}")
        return self._resolved(None, problems)

    def _resolved(self, ref: CheckpointRef | None, problems: list[str]) -> CheckpointRef | None:
        """Record (and log once) what ``resolve_latest`` had to skip to reach ``ref``."""
        problem = None
        if problems:
            to = f"v{ref.version:06d}" if ref is not None else "nothing (no readable commit)"
            problem = "; ".join(problems) + f"; using {to}"
        self._report_problem(problem)
        return ref

    # --- verify / fetch -----------------------------------------------------------------------------------

    def verified_dir(self, version: int, cache_dir: str | Path) -> Path:
        """A local directory of `version` whose every file was just checked against COMMIT.json.

        Posix root: the checkpoint's own directory, verified in place (nothing is copied; files that
        COMMIT.json does not list are refused too, so a loader cannot pick up an unverified file).
        S3: `fetch` into `cache_dir`. Raises CheckpointNotFoundError or CheckpointIntegrityError.
        """
        if not self.storage.is_local:
            return self.fetch(version, cache_dir)
        _, doc = self._commit_doc(version)
        path = self.storage.local_path(keys.checkpoint_dir(version))
        assert path is not None
        t0 = time.perf_counter()
        algo = _algo(doc)
        extra = [
            n
            for n in _local_files(path)
            if n != keys.CHECKPOINT_COMMIT_NAME and not n.startswith("acks/") and n not in doc["files"]
        ]
        if extra:
            raise CheckpointIntegrityError(extra[0], "not listed in COMMIT.json")

        def check(name: str) -> None:
            expect = doc["files"][name]
            try:
                if (path / name).stat().st_size != expect["size"]:  # cheap early refusal
                    raise CheckpointIntegrityError(name, f"size differs from {expect['size']} in COMMIT.json")
                _check_digest(name, hash_file(path / name, algo), expect, algo)
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
        logger.debug(
            "verified checkpoint v%06d in place (%s) in %.3fs", version, algo, time.perf_counter() - t0
        )
        return path

    def fetch(self, version: int, cache_dir: str | Path) -> Path:
        """Download `version` into `cache_dir/v{N:06d}`, verifying size + digest of every file.

        A private copy, also on a posix root (use `verified_dir` to skip the copy there). Reuses the
        cache dir when its verified marker matches COMMIT.json. Files go to a temp dir that is renamed
        into place only after all verify, so a half-downloaded dir is never returned.
        Raises CheckpointNotFoundError (not committed) or CheckpointIntegrityError (naming the file).
        """
        raw, doc = self._commit_doc(version)
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
            algo = _algo(doc)
            names = sorted(doc["files"], key=lambda n: -doc["files"][n]["size"])
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                futs = [
                    pool.submit(self._fetch_one, f"{ck_dir}/{n}", tmp / n, n, doc["files"][n], algo)
                    for n in names
                ]
                for f in futs:
                    f.result()
            (tmp / VERIFIED_MARKER).write_text(json.dumps({"version": version, "commit_sha256": commit_sha}))
            self._install(tmp, dest, doc, commit_sha)
            logger.debug("fetched checkpoint v%06d into %s in %.2fs", version, dest, time.perf_counter() - t0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def _fetch_one(self, key: str, target: Path, name: str, expect: dict[str, Any], algo: str) -> None:
        # Always a real copy: a hard link would let anyone writing into the cache corrupt the store.
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest = self.storage.get_file(key, target, size=expect["size"], algo=algo)
        except FileNotFoundError:
            raise CheckpointIntegrityError(name, "missing from storage") from None
        _check_digest(name, digest, expect, algo)

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

    def ack(self, version: int, server_id: str, *, state: Literal["loading", "serving"] = "serving") -> None:
        """Record that `server_id` serves `version`, or (state="loading") is about to verify and load it.
        The ack names its owner, this process (`ack_owner`)."""
        self.storage.put_json(
            keys.ack_key(version, server_id),
            {
                "server_id": server_id,
                "version": version,
                "state": state,
                "acked_at": time.time(),
                "owner": ack_owner(),
            },
        )

    def retract_ack(self, version: int, server_id: str) -> None:
        """Delete `server_id`'s ack of `version` (a "loading" ack whose load failed). Idempotent."""
        self.storage.delete(keys.ack_key(version, server_id))

    def acks(self) -> dict[str, int]:
        """Latest acked version per live server (servers whose latest ack is older than ack_ttl_s are dropped)."""
        return self._live_acks([k for k in self.storage.list(keys.CHECKPOINT_DIR) if _ACK_RE.match(k)])

    def _live_acks(self, ack_keys: list[str]) -> dict[str, int]:
        latest: dict[str, int] = {}
        for k in ack_keys:
            m = _ACK_RE.match(k)
            assert m is not None
            v, server = int(m.group(1)), m.group(2)
            latest[server] = max(v, latest.get(server, -1))
        now = time.time()
        live: dict[str, int] = {}
        for server, v in latest.items():
            try:
                doc = self.storage.get_json(keys.ack_key(v, server))
                acked_at = float(doc["acked_at"])
            except (FileNotFoundError, ValueError, KeyError, TypeError, RecursionError):
                if self.ack_ttl_s is None:
                    live[server] = v  # without a TTL an unreadable ack still counts, as it always did
                continue
            if _owner_gone(doc.get("owner")):
                continue
            if self.ack_ttl_s is None or now - acked_at <= self.ack_ttl_s:
                live[server] = v
        return live

    def gc(self, keep_last: int) -> list[int]:
        """Delete old versions per the GC rule (module docstring); returns the deleted versions.

        Also removes uncommitted (abandoned) version dirs older than every kept version. A committed
        victim that gained an ack after the floor was computed (a watcher began loading it) is kept.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        listing = self.storage.list(keys.CHECKPOINT_DIR)
        committed = sorted(int(m.group(1)) for k in listing if (m := _COMMIT_RE.match(k)))
        if not committed:
            return []
        seen_acks = [k for k in listing if _ACK_RE.match(k)]
        keep = set(committed[-keep_last:])
        served = self._live_acks(seen_acks)
        floor = min(served.values()) if served else None
        oldest_kept = min(keep)
        victims = [v for v in committed if v not in keep and (floor is None or v < floor)]
        committed_set = set(committed)
        for d in self.storage.list_dirs(keys.CHECKPOINT_DIR):
            v = keys.parse_version_dir(d)
            if v is not None and v not in committed_set and v < oldest_kept and (floor is None or v < floor):
                victims.append(v)
        deleted = []
        seen = set(seen_acks)
        for v in sorted(victims):
            if v in committed_set and any(k not in seen for k in self.storage.list(keys.ack_dir(v))):
                logger.debug("checkpoint gc: keeping v%06d, a server acked it meanwhile", v)
                continue
            self.storage.delete(keys.checkpoint_commit_key(v))  # un-commit first
            self.storage.delete(keys.checkpoint_dir(v), recursive=True)
            deleted.append(v)
        if deleted:
            logger.debug(
                "checkpoint gc: deleted %s (keep_last=%d, served floor=%s)", deleted, keep_last, floor
            )
        return deleted

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
