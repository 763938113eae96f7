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


class ImpossibleVersionError(SchemaMismatchError):
    """A trained token (loss_mask 1) carries a policy version that cannot exist: negative, or newer than
    the newest policy published when its shard was written (`ShardWriter`'s `version_ceiling`).

    `field` is `"versions"`. Raised on write (the group is evicted) and on read for a negative version
    (the shard is quarantined); a group newer than LATEST on read is refused by `ShardReader` instead.
    """


class MixedPromptGroupError(SchemaMismatchError, InvalidTrajectoryError):
    """The rows of one group (one `group_id`) carry different `prompt_id`s, or two groups share one id.

    GRPO normalises a group's rewards together, so its rows must be samples of one prompt. `field` is
    `"prompt_id"` (or `"group_id"` for a repeated id). Raised on write and on read, never merged.
    """


class UnsafePathError(StorageError, ValueError):
    """A key of a local trial root resolves, through a symlink, to a file outside the trial root.

    Nothing is read through such a key: a shard or record behind it is quarantined by the reader, a
    listing skips a linked directory. The fix is to remove the link (or copy the data into the root).
    """


class QueryError(StorageError, ValueError):
    """SQL over a trial's trajectories that DuckDB refused (`storage.query`), with the views it can use."""
