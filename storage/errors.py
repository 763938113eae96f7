"""Named exceptions of the storage layer.

This module is only the exception hierarchy; it is NOT where errors are handled. Every exception derives
from `StorageError`, so a caller can catch the whole layer with one clause. Messages never contain
credentials (`storage.fs.Storage` scrubs them with `storage.scrub`).
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error raised by `storage`."""


class SchemaMismatchError(StorageError):
    """A table or shard does not match `TRAJECTORY_SCHEMA` (or its schema_version).

    `field` names the offending column (or `"schema_version"`), so the message says what to fix.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"schema mismatch in field {field!r}: {reason}")


class NonFiniteValueError(SchemaMismatchError):
    """A reward or behaviour logprob is NaN or +-inf in float32 (a reward of 1e39 becomes inf there).

    Raised on write (the group is refused) and on read (the shard is quarantined); `field` names the column.
    """


class InvalidTrajectoryError(StorageError, ValueError):
    """A `TrajectoryRow` / `TrajectoryGroup` breaks an invariant (list lengths, loss mask, head/tail)."""


class CommitConflictError(StorageError):
    """An exclusive put found the key already there (someone else committed first)."""


class CorruptShardError(StorageError):
    """A committed shard failed verification: missing, wrong size or sha256, unreadable or foreign.

    The reader quarantines such a shard instead of raising; this error carries the reason.
    """


class CheckpointIntegrityError(StorageError):
    """A checkpoint file is missing or its size / sha256 differs from COMMIT.json. `file` names it."""

    def __init__(self, file: str, reason: str) -> None:
        self.file = file
        self.reason = reason
        super().__init__(f"checkpoint file {file!r}: {reason}")


class CheckpointNotFoundError(StorageError, LookupError):
    """No committed checkpoint (no COMMIT.json) exists for the requested version."""
