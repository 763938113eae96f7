"""The storage contracts the RL core depends on: typed Protocols, implemented by ``storage/``.

What it is: the one place that says what rollout, the trainer and the checkpoint watcher need from
storage, so each can be tested with a ten-line fake and ``storage/`` can change behind them.

* ``ObjectStore``      keys -> bytes/JSON/files under one trial (``storage.fs.Storage``);
  the trainer's resume points and audit trail use it.
* ``ShardSink``        where rollout puts accepted groups (``storage.shard_writer.ShardWriter``):
  buffered, committed in shards; each call returns a record (truthy) once all it buffered is committed.
* ``ShardSource``      where the trainer takes groups (``storage.shard_reader.ShardReader``):
  ``take(n, min_head_version=v)`` returns up to ``n`` groups oldest first, exactly once; staler ones
  are consumed and counted (``TakeResult``).
* ``CheckpointSink``   where the trainer publishes weights (``storage.checkpoints.CheckpointStore``).
* ``CheckpointSource`` where the watcher finds, verifies and acknowledges them (the same store).

``MetricsSink`` (``rollflow.api.metrics``) and ``InferenceClient`` (``rollflow.api.inference``)
complete the set of injected collaborators.

What it is not: an implementation. Nothing here imports storage, pyarrow or torch; the trajectory
types (``TrajectoryGroup``, ``TakeResult``, ``FileDigest``, ``CheckpointRef``) are named under
``TYPE_CHECKING`` only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from storage.checkpoints import CheckpointRef
    from storage.schema import TrajectoryGroup
    from storage.shard_reader import TakeResult
    from storage.transfer import FileDigest

__all__ = [
    "CheckpointSink",
    "CheckpointSource",
    "CommittedRows",
    "ObjectStore",
    "ShardSink",
    "ShardSource",
]


@runtime_checkable
class ObjectStore(Protocol):
    """Keys (``"trainer/state-00000010.json"``) under one ``{root}/{experiment}/{trial}/`` prefix."""

    is_local: bool  # a posix root (cheap listing, in-place reads) rather than an object store

    def put_json(self, key: str, obj: Any, *, exclusive: bool = False) -> None: ...

    def get_json(self, key: str) -> Any: ...  # FileNotFoundError when absent

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int: ...  # FileNotFoundError when absent

    def list(self, prefix: str) -> list[str]: ...  # keys below prefix, recursively

    def list_dirs(self, prefix: str) -> list[str]: ...  # direct sub-"directories" of prefix

    def delete(self, key: str, *, recursive: bool = False) -> None: ...

    def put_file(self, local_path: str | Path, key: str, *, algo: str = "sha256") -> FileDigest: ...

    def get_file(
        self, key: str, local_path: str | Path, *, size: int | None = None, algo: str = "sha256"
    ) -> FileDigest: ...


class ShardSink(Protocol):
    """Rollout's output: ``add`` buffers a group; ``maybe_flush`` commits when a size/age limit is hit;
    ``flush`` commits now. Each returns the commit record (truthy) once everything it held is committed:
    a ``CommittedRows`` when it says how many rows it committed."""

    flush_rows: int  # an add that brings the buffer to this many rows commits it

    def add(self, group: TrajectoryGroup) -> Any: ...

    def maybe_flush(self) -> Any: ...

    def flush(self) -> Any: ...


@runtime_checkable
class CommittedRows(Protocol):
    """A commit record that counts its rows (``storage.commits.CommitRecord``)."""

    rows: int


class ShardSource(Protocol):
    """The trainer's input: committed groups, oldest first, each exactly once (the reader's cursor)."""

    def take(self, n_groups: int, *, min_head_version: int | None = None) -> TakeResult: ...


class CheckpointSink(Protocol):
    """Publishing weights: write into ``staging_dir(v)`` where the store allows it (posix root; None on
    S3), then ``publish`` (COMMIT.json last, then LATEST); ``gc`` keeps the newest ``keep_last``.

    ``hash_algo``: the digest the store records (``"blake3"``, ``"sha256"``); the publisher hashes the
    files with it while writing them and hands the digests to ``publish`` (``digests=``). None: a store
    that takes no digests and hashes what it uploads itself.
    """

    hash_algo: str | None

    def staging_dir(self, version: int) -> Path | None: ...

    def publish(
        self,
        local_dir: str | Path,
        version: int,
        *,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        digests: Mapping[str, FileDigest] | None = None,  # only when hash_algo is set
    ) -> CheckpointRef | Any: ...

    def gc(self, keep_last: int) -> list[int]: ...


class CheckpointSource(Protocol):
    """What the checkpoint watcher needs: find the newest version, get a verified local copy, ack it."""

    def latest_version(self) -> int | None: ...  # what LATEST names (one small read)

    def resolve_latest(self) -> CheckpointRef | None: ...  # the newest committed one (.version, .created_at)

    def latest_token(self) -> Any | None: ...  # cheap fingerprint of LATEST; None where there is none

    def latest_problem(self) -> str | None: ...  # why the last read found LATEST malformed, else None

    def subscribe(self) -> threading.Event: ...  # set when this process moves LATEST forward

    def verified_dir(  # in place where possible; defer_weights: the loader checks the weights' digests
        self, version: int, cache_dir: str | Path, *, defer_weights: bool = False
    ) -> Path: ...

    def fetch(self, version: int, cache_dir: str | Path) -> Path: ...  # always a verified private copy

    def get(self, version: int) -> Any: ...  # COMMIT.json as an object: .files, .hash_algo, .is_adapter

    def ack(
        self, version: int, server_id: str, *, state: Literal["loading", "serving"] = "serving"
    ) -> None: ...

    def retract_ack(self, version: int, server_id: str) -> None: ...
