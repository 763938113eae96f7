"""`CheckpointStore`: publish and resolve HF checkpoints; verify, acknowledge and GC through its parts.

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

`publish` refuses a directory whose shard index names a file it does not hold (an absolute or `../` shard
would be loaded from outside, unverified) and, in place on a posix root, a file that is a symlink out of the
trial root. Verification (``storage.checkpoint_fetch``), the COMMIT.json format (``storage.checkpoint_commit``) and
acks + GC (``storage.checkpoint_acks``, which states the GC rule) are modules of their own;
``CheckpointStore`` keeps one public surface over them (``verified_dir``, ``fetch``, ``ack``,
``retract_ack``, ``acks``, ``gc``) and the trainer's done marker (``mark_done``, ``is_done``).

A version may hold a LoRA adapter instead of a full model (`train.lora`): `adapter_model.safetensors` +
`adapter_config.json` (peft's format), with `meta.kind = "adapter"` and `meta.base_model` in COMMIT.json.
It is published, verified, acknowledged and collected exactly like a full checkpoint;
`CheckpointRef.is_adapter` tells them apart.

What this is NOT: a model loader (transformers does that) or a weight-update driver (the watcher is).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from storage import keys
from storage.checkpoint_acks import CheckpointAcks, ack_owner
from storage.checkpoint_commit import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    COMMIT_FORMAT,
    COMMIT_RE,
    SHARD_INDEX_NAME,
    VERIFIED_MARKER,
    CheckpointRef,
    check_inside,
    check_needed_files,
    commit_algo,
    local_files,
    parse_commit,
    parse_latest,
)
from storage.checkpoint_fetch import CheckpointFetcher
from storage.errors import (
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    CommitConflictError,
    StorageError,
)
from storage.fs import Storage
from storage.transfer import HASH_ALGOS, FileDigest, default_hash_algo, hash_file

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "VERIFIED_MARKER",
    "CheckpointRef",
    "CheckpointStore",
    "ack_owner",
    "parse_latest",
]

logger = logging.getLogger(__name__)

# In-process wake-ups: trial root URI -> events of the watchers subscribed to it (see `subscribe`).
_WAKE_LOCK = threading.Lock()
_WAKE: dict[str, weakref.WeakSet[threading.Event]] = {}


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
        names = local_files(local_dir)
        if not names:
            raise StorageError(f"checkpoint dir {local_dir} is empty")
        for n in names:
            if n == keys.CHECKPOINT_COMMIT_NAME or n.startswith("acks/"):
                raise StorageError(f"checkpoint dir holds reserved name {n!r}")
        index = local_dir / SHARD_INDEX_NAME
        check_needed_files(names, index.read_bytes() if SHARD_INDEX_NAME in names else None)
        known = {n: d for n, d in (digests or {}).items() if d.algo == self.hash_algo and n in names}
        ck_dir = keys.checkpoint_dir(version)
        commit_key = keys.checkpoint_commit_key(version)
        if self.storage.exists(commit_key):
            existing = parse_commit(self.storage.get_bytes(commit_key), version)
            self._check_same(existing, local_dir, names, known, version)
            logger.debug("checkpoint v%06d already committed with the same files", version)
            self._advance_latest(version)
            return self._ref(existing)

        t0 = time.perf_counter()
        in_place = self.storage.local_path(ck_dir)
        if in_place is not None and in_place.resolve() == local_dir.resolve():
            root = self.storage.local_path("")
            assert root is not None
            for n in names:  # committed in place, a link out of the root would be served from outside
                check_inside(n, local_dir / n, root)
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
            existing = parse_commit(self.storage.get_bytes(commit_key), version)
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
        algo = commit_algo(existing)
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
            hash_algo=commit_algo(doc),
        )

    def _commit_doc(self, version: int) -> tuple[bytes, dict[str, Any]]:
        try:
            raw = self.storage.get_bytes(keys.checkpoint_commit_key(version))
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"no committed checkpoint v{version:06d}") from None
        return raw, parse_commit(raw, version)

    def get(self, version: int) -> CheckpointRef:
        """The committed checkpoint `version`; CheckpointNotFoundError if it has no COMMIT.json."""
        return self._ref(self._commit_doc(version)[1])

    def list_committed(self) -> list[int]:
        """Versions that have a COMMIT.json, ascending."""
        out = []
        for k in self.storage.list(keys.CHECKPOINT_DIR):
            m = COMMIT_RE.match(k)
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

    # --- verify / fetch (storage.checkpoint_fetch) --------------------------------------------------------

    def verified_dir(self, version: int, cache_dir: str | Path, *, defer_weights: bool = False) -> Path:
        """A local directory of `version` whose every file was just checked against COMMIT.json.

        Posix root: the checkpoint's own directory, verified in place (nothing is copied; files that
        COMMIT.json does not list are refused too, so a loader cannot pick up an unverified file).
        S3: `fetch` into `cache_dir`. Raises CheckpointNotFoundError or CheckpointIntegrityError.
        `defer_weights` (posix root): the `*.safetensors` files' digests are left to a loader that checks
        them in its one read of them (`rollflow.models.verified_weights`); everything else is checked here.
        """
        if not self.storage.is_local:
            return self.fetch(version, cache_dir)
        _, doc = self._commit_doc(version)
        fetcher = CheckpointFetcher(self.storage, self.max_workers)
        return fetcher.verify_in_place(version, doc, defer_weights=defer_weights)

    def fetch(self, version: int, cache_dir: str | Path) -> Path:
        """Download `version` into `cache_dir/v{N:06d}`, verifying size + digest of every file.

        A private copy, also on a posix root (use `verified_dir` to skip the copy there). Reuses the
        cache dir when its verified marker matches COMMIT.json. Files go to a temp dir that is renamed
        into place only after all verify, so a half-downloaded dir is never returned.
        Raises CheckpointNotFoundError (not committed) or CheckpointIntegrityError (naming the file).
        """
        raw, doc = self._commit_doc(version)
        return CheckpointFetcher(self.storage, self.max_workers).fetch(version, raw, doc, cache_dir)

    # --- acks and gc (storage.checkpoint_acks) ------------------------------------------------------------

    def _acks(self) -> CheckpointAcks:
        return CheckpointAcks(self.storage, self.ack_ttl_s)

    def ack(self, version: int, server_id: str, *, state: Literal["loading", "serving"] = "serving") -> None:
        """Record that `server_id` serves `version`, or (state="loading") is about to verify and load it.
        The ack names its owner, this process (`ack_owner`)."""
        self._acks().ack(version, server_id, state=state)

    def retract_ack(self, version: int, server_id: str) -> None:
        """Delete `server_id`'s ack of `version` (a "loading" ack whose load failed). Idempotent."""
        self._acks().retract_ack(version, server_id)

    def acks(self) -> dict[str, int]:
        """Latest acked version per live server (servers whose latest ack is older than ack_ttl_s are dropped)."""
        return self._acks().acks()

    def gc(self, keep_last: int) -> list[int]:
        """Delete old versions per the GC rule (``storage.checkpoint_acks``); returns the deleted versions."""
        return self._acks().gc(keep_last)

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
