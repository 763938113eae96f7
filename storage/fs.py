"""`Storage`: one trial's corner of a filesystem (local dir or S3), with atomic and exclusive puts.

What this is: an fsspec filesystem plus the trial prefix `{root}/{experiment}/{trial}/`. Every key is
relative to that prefix (`storage.keys` builds them). Two backends, chosen by the root URL:

- posix (bare path or `file://`): a put writes a temp file beside the key and `os.replace`s it; an
  exclusive put `os.link`s the temp file to the key, which fails if the key exists. `fsync=True` in the
  options also fsyncs the file and its directory (durability across power loss; off by default).
- S3 (`s3://bucket/prefix`): a put is one PutObject (objects appear atomically); an exclusive put adds
  `IfNoneMatch: "*"`. `fs.mv` is copy + delete on S3, so nothing here relies on renames.

Opening a root (URL parsing, options, S3 credentials) is `storage.backends`.

What this is NOT: a cache, a retry layer (s3fs retries requests) or a place for the key layout.

Symlinks (posix): `get_bytes` reads a key only if its real path (every symlink resolved) is inside the
real trial root, else `UnsafePathError` names the key and the fix; a reader quarantines a shard or
record behind such a link. A listing never leaves the root: `list_dirs` skips a linked directory that
resolves outside it and `list` of such a prefix is empty, each logged once at ERROR. (`get_file`, the
checkpoint path, is checked by the checkpoint store.)

Credentials (options `key`, `secret`, `token` or the `AWS_*` variables, and any user:password in the
endpoint URL) never appear in `repr`, `str`, log lines or exception messages raised from here (the
scrubbing itself is `storage.scrub`). An exclusive put is a conflict by the S3 error code
(`PreconditionFailed`, `ConditionalRequestConflict`), never by matching message text; an exclusive put
whose key already holds exactly the same bytes (a retry whose first attempt landed) is a success.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec

from storage.backends import CONFLICT_CODES, ensure_bucket, open_backend, s3_error_code
from storage.errors import CommitConflictError, StorageError, UnsafePathError
from storage.scrub import scrubbing
from storage.transfer import (
    CHUNK_SIZE,
    DEFAULT_CONCURRENCY,
    FileDigest,
    copy_hashed,
    download_hashed,
    fsync_dir,
    upload_hashed,
)

logger = logging.getLogger(__name__)

TMP_MARKER = ".rollflow-tmp-"


class Storage:
    """fsspec filesystem + the trial prefix {root}/{experiment}/{trial}/; all keys are relative to it.

    Build with `Storage.open(root, experiment, trial, options)`. Thread-safe for concurrent calls.
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        base: str,
        root_uri: str,
        *,
        is_local: bool,
        secrets: tuple[str, ...] = (),
        fsync: bool = False,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        endpoint: str | None = None,
    ) -> None:
        self.fs = fs
        self.base = base.rstrip("/")  # filesystem path of the trial root (no scheme)
        self.root_uri = root_uri  # trial root URI without credentials
        self.is_local = is_local
        self.fsync = fsync
        self.max_concurrency = max_concurrency
        self.chunk_size = CHUNK_SIZE  # transfer chunk / multipart part size (S3 needs >= 5 MiB)
        self._endpoint = endpoint
        self._secrets = tuple(s for s in secrets if s and len(s) >= 3)
        self._outside_logged: set[str] = set()  # linked paths outside the root, logged once each

    # --- construction -------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, root: str, experiment: str, trial: str, options: Mapping[str, Any] | None = None
    ) -> Storage:
        """Open `{root}/{experiment}/{trial}/`.

        root: a bare path, `file://...` or `s3://bucket/prefix`. options (all optional): `endpoint_url`,
        `key`, `secret`, `token`, `region` for S3 (else `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`,
        `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` /
        `AWS_DEFAULT_REGION`); `fsync` (posix durability, default False); `max_concurrency` (parallel
        parts / files per transfer, default 4).
        """
        backend = open_backend(root, experiment, trial, options)
        # a Backend's fields are this constructor's arguments, by name
        return cls(**{f.name: getattr(backend, f.name) for f in dataclasses.fields(backend)})

    def __repr__(self) -> str:
        ep = f", endpoint={self._endpoint!r}" if self._endpoint else ""
        return f"Storage({self.root_uri!r}{ep})"

    __str__ = __repr__

    # --- paths --------------------------------------------------------------------------------------------

    @staticmethod
    def _check_key(key: str, *, allow_empty: bool = False) -> str:
        key = key.strip("/")
        if not key and allow_empty:
            return key
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or "\\" in key:
            raise StorageError(f"invalid storage key {key!r}: relative, '/'-separated, no '.' or '..' parts")
        return key

    def _path(self, key: str, *, allow_empty: bool = False) -> str:
        key = self._check_key(key, allow_empty=allow_empty)
        return f"{self.base}/{key}" if key else self.base

    def uri(self, key: str) -> str:
        """Full location of `key`: an absolute path (posix) or `s3://bucket/...`; never credentials."""
        key = self._check_key(key, allow_empty=True)
        return f"{self.root_uri}/{key}" if key else self.root_uri

    def local_path(self, key: str) -> Path | None:
        """The posix path of `key` on a local backend, None on S3."""
        return Path(self._path(key, allow_empty=True)) if self.is_local else None

    def _outside_root(self, path: str) -> str | None:
        """The real path of local `path` if it resolves outside the real trial root, else None."""
        real, root = os.path.realpath(path), os.path.realpath(self.base)
        return None if real == root or real.startswith(root + os.sep) else real

    def _checked_read_path(self, key: str) -> str:
        """The posix path of `key`, or UnsafePathError if a symlink takes it outside the trial root."""
        path = self._path(key)
        real = self._outside_root(path)
        if real is not None:
            raise UnsafePathError(
                f"{key} resolves to {real}, outside the trial root {self.root_uri} (a symlink); it is not "
                "read. Remove the link, or copy the file into the trial root"
            )
        return path

    def _skip_outside(self, path: str) -> bool:
        """True (logged once) if local `path` resolves outside the trial root: a listing skips it."""
        real = self._outside_root(path)
        if real is None:
            return False
        if path not in self._outside_logged:
            self._outside_logged.add(path)
            logger.error(
                "not listing %s: it resolves to %s, outside the trial root %s (a symlink); remove the link",
                self._rel(path),
                real,
                self.root_uri,
            )
        return True

    def _rel(self, full: str) -> str:
        return full[len(self.base) + 1 :] if full.startswith(self.base + "/") else full

    def _bucket_key(self, key: str) -> tuple[str, str]:
        bucket, _, rest = self._path(key).partition("/")
        return bucket, rest

    # --- single objects -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _local_tmp(self, path: str) -> Iterator[str]:
        """A temp path beside `path` (same directory, so the rename is atomic), removed on the way out."""
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
        try:
            yield tmp
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _publish_tmp(self, tmp: str, path: str, key: str, exclusive: bool) -> None:
        if not exclusive:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise CommitConflictError(f"key already exists: {key}") from None
            except OSError as e:  # filesystems without hard links: O_EXCL create + copy (not atomic)
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    raise CommitConflictError(f"key already exists: {key}") from None
                with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
                    shutil.copyfileobj(src, out)
        if self.fsync:
            fsync_dir(os.path.dirname(path))

    @scrubbing
    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        """Atomically store `data` at `key`.

        exclusive=True: CommitConflictError if `key` holds other bytes. If it holds exactly `data`, the
        put succeeds: that is a retry whose first attempt landed (on S3 the client retries a put whose
        response was lost, and the retry meets its own object), not a conflict.
        """
        try:
            self._put_bytes(key, data, exclusive)
        except CommitConflictError:
            try:
                existing = self.get_bytes(key)
            except FileNotFoundError:
                existing = None
            if existing != data:
                raise
            logger.info("exclusive put of %s found identical bytes in place (a retried put)", key)

    def _put_bytes(self, key: str, data: bytes, exclusive: bool) -> None:
        path = self._path(key)
        if self.is_local:
            with self._local_tmp(path) as tmp:
                with open(tmp, "wb") as f:
                    f.write(data)
                    if self.fsync:
                        f.flush()
                        os.fsync(f.fileno())
                self._publish_tmp(tmp, path, key, exclusive)
            return
        if not exclusive:
            self.fs.pipe_file(path, data)
            return
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:  # s3fs's translation of PreconditionFailed on If-None-Match
            raise CommitConflictError(f"key already exists: {key}") from None
        except OSError as e:
            if s3_error_code(e) not in CONFLICT_CODES:
                raise
            raise CommitConflictError(f"key already exists: {key}") from None

    @scrubbing
    def get_bytes(self, key: str) -> bytes:
        """The bytes at `key`; FileNotFoundError if absent, UnsafePathError if a symlink leaves the root."""
        if self.is_local:
            with open(self._checked_read_path(key), "rb") as f:
                return f.read()
        return self.fs.cat_file(self._path(key))

    def put_json(self, key: str, obj: Any, *, exclusive: bool = False) -> None:
        """`put_bytes` of `json.dumps(obj, sort_keys=True)` (UTF-8)."""
        self.put_bytes(key, json.dumps(obj, sort_keys=True, indent=1).encode(), exclusive=exclusive)

    def get_json(self, key: str) -> Any:
        """`json.loads(get_bytes(key))`; FileNotFoundError if absent, ValueError if not JSON."""
        return json.loads(self.get_bytes(key))

    @scrubbing
    def exists(self, key: str) -> bool:
        """True if `key` is an object (or a non-empty prefix)."""
        path = self._path(key)
        if self.is_local:
            return os.path.exists(path)
        return bool(self.fs.exists(path))

    @scrubbing
    def size(self, key: str) -> int:
        """Size in bytes of the object at `key`; FileNotFoundError if absent."""
        path = self._path(key)
        if self.is_local:
            return os.stat(path).st_size
        return int(self.fs.info(path)["size"])

    @scrubbing
    def modified_at(self, key: str) -> float | None:
        """When the object at `key` was last written (seconds since the epoch); None if it is absent or
        the store does not say."""
        path = self._path(key)
        try:
            if self.is_local:
                return os.stat(path).st_mtime
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        stamp = info.get("LastModified", info.get("mtime"))
        if hasattr(stamp, "timestamp"):  # s3fs: a datetime
            return float(stamp.timestamp())
        return float(stamp) if isinstance(stamp, (int, float)) else None

    # --- listing ------------------------------------------------------------------------------------------

    @scrubbing
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (as a directory), recursive, sorted; [] if there are none."""
        path = self._path(prefix, allow_empty=True)
        if self.is_local:
            out: list[str] = []
            if self._skip_outside(path):
                return out
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel_dir = self._rel(dirpath) if dirpath != self.base else ""
                for n in filenames:
                    if TMP_MARKER in n:
                        continue
                    out.append(f"{rel_dir}/{n}" if rel_dir else n)
            return sorted(out)
        try:
            found = self.fs.find(path)
        except FileNotFoundError:
            return []
        return sorted(self._rel(p) for p in found if p.startswith(path + "/"))

    @scrubbing
    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate child 'directories' of `prefix` as keys, sorted; [] if there are none."""
        path = self._path(prefix, allow_empty=True)
        if self.is_local:
            try:
                if self._skip_outside(path):
                    return []
                with os.scandir(path) as it:
                    entries = [e for e in it if e.is_dir() and not e.name.startswith(".")]
            except (FileNotFoundError, NotADirectoryError):
                return []
            # a real directory inside the (real) root is inside it; only a link may lead out
            names = [e.name for e in entries if not (e.is_symlink() and self._skip_outside(e.path))]
            return sorted(self._rel(f"{path}/{n}") for n in names)
        try:
            entries = self.fs.ls(path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(self._rel(e["name"].rstrip("/")) for e in entries if e["type"] == "directory")

    # --- deletion -----------------------------------------------------------------------------------------

    @scrubbing
    def delete(self, key: str, *, recursive: bool = False) -> None:
        """Delete `key` (and everything under it if recursive). Absent keys are fine (idempotent)."""
        path = self._path(key)
        if self.is_local:
            if os.path.isdir(path) and not os.path.islink(path):
                if not recursive:
                    raise IsADirectoryError(f"{key} is a directory; pass recursive=True")
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return
        if recursive:
            keys = self.fs.find(path)
            if keys:
                self.fs.rm(keys)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    # --- files --------------------------------------------------------------------------------------------

    @scrubbing
    def put_file(self, local_path: str | Path, key: str, *, algo: str = "sha256") -> FileDigest:
        """Atomically upload a local file to `key`, returning its size and digest (hashed on the way)."""
        path = self._path(key)
        if self.is_local:
            with self._local_tmp(path) as tmp:
                with open(local_path, "rb", buffering=0) as src, open(tmp, "wb", buffering=0) as dst:
                    digest = copy_hashed(src, dst, self.chunk_size, algo)
                    if self.fsync:
                        os.fsync(dst.fileno())
                self._publish_tmp(tmp, path, key, exclusive=False)
            return digest
        bucket, obj = self._bucket_key(key)
        return upload_hashed(
            self.fs,
            local_path,
            bucket,
            obj,
            chunk_size=self.chunk_size,
            concurrency=self.max_concurrency,
            algo=algo,
        )

    @scrubbing
    def get_file(
        self, key: str, local_path: str | Path, *, size: int | None = None, algo: str = "sha256"
    ) -> FileDigest:
        """Download `key` to `local_path` (temp + rename), returning size and digest (hashed on the way).

        `size`, if known, saves a HEAD request on S3. FileNotFoundError if `key` is absent.
        """
        path = self._path(key)
        local_path = str(local_path)
        directory, name = os.path.split(os.path.abspath(local_path))
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
        try:
            with open(tmp, "wb", buffering=0) as dst:
                if self.is_local:
                    with open(path, "rb", buffering=0) as src:
                        digest = copy_hashed(src, dst, self.chunk_size, algo)
                else:
                    digest = download_hashed(
                        self.fs, path, dst, size=size, chunk_size=self.chunk_size, algo=algo
                    )
            os.replace(tmp, local_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return digest

    # --- S3 helpers ---------------------------------------------------------------------------------------

    @scrubbing
    @scrubbing
    def ensure_bucket(self) -> None:
        """Create the S3 bucket if it does not exist (tests, local S3 servers). No-op on posix."""
        if not self.is_local:
            ensure_bucket(self.fs, self.base)
