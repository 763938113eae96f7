"""Trajectory shards: one import point for the writer, the reader and the commit record.

The protocol lives in three modules, one concept each: `storage.commits` (the record format),
`storage.shard_writer` (buffer -> shard -> record) and `storage.shard_reader` (records -> verified groups,
exactly-once cursor, quarantine). This module only re-exports them.
"""

from storage.commits import CommitRecord, partition_version
from storage.shard_reader import ReaderCursor, ShardReader, TakeResult
from storage.shard_writer import ShardWriter

__all__ = ["CommitRecord", "ReaderCursor", "ShardReader", "ShardWriter", "TakeResult", "partition_version"]
