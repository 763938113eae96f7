"""rollflow's storage layer: the bottom of the stack; it imports nothing else from this repository.

- `storage.fs.Storage`: a trial root on a local dir or S3, with atomic and exclusive puts;
- `storage.keys`: the key layout (DESIGN.md, "Storage");
- `storage.schema`: the trajectory Arrow schema, `TrajectoryRow` / `TrajectoryGroup`, validation;
- `storage.commits`, `storage.shard_writer`, `storage.shard_reader`: `CommitRecord`, `ShardWriter`,
  `ShardReader`, `ReaderCursor` (the commit protocol);
- `storage.checkpoints`: `CheckpointStore` (publish / resolve / fetch / ack / gc);
- `storage.validate`: value checks at the boundary (finite rewards/logprobs, token ids, record parsing);
- `storage.scrub`: credential scrubbing of log lines and exception messages;
- `storage.errors`: the named exceptions.

See docs/storage.md for the protocols.
"""

from storage.checkpoints import CheckpointRef, CheckpointStore
from storage.commits import CommitRecord
from storage.errors import (
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    CommitConflictError,
    CorruptShardError,
    ImpossibleVersionError,
    InvalidTrajectoryError,
    MixedPromptGroupError,
    SchemaMismatchError,
    StorageError,
    UnsafePathError,
)
from storage.fs import Storage
from storage.schema import (
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    TrajectoryGroup,
    TrajectoryRow,
    groups_to_table,
    table_to_groups,
    validate_table,
)
from storage.shard_reader import ReaderCursor, ShardReader, TakeResult
from storage.shard_writer import ShardWriter
from storage.transfer import FileDigest

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "CheckpointIntegrityError",
    "CheckpointNotFoundError",
    "CheckpointRef",
    "CheckpointStore",
    "CommitConflictError",
    "CommitRecord",
    "CorruptShardError",
    "FileDigest",
    "ImpossibleVersionError",
    "InvalidTrajectoryError",
    "MixedPromptGroupError",
    "ReaderCursor",
    "SchemaMismatchError",
    "ShardReader",
    "ShardWriter",
    "Storage",
    "StorageError",
    "TakeResult",
    "TrajectoryGroup",
    "TrajectoryRow",
    "UnsafePathError",
    "groups_to_table",
    "table_to_groups",
    "validate_table",
]
