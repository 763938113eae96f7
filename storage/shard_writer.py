"""`ShardWriter`: buffers trajectory groups and commits them as Parquet shards.

A flush (by row count, by buffer age, or on `close`) does, in order:

1. encode the buffered groups as one Parquet file in memory (schema validated by `groups_to_table`);
2. put it at `trajectories/data/{writer_id}-{seq:08d}.parquet` in one atomic put;
3. put its `CommitRecord` at `trajectories/commits/v{min_head:06d}/{writer_id}-{seq:08d}.json` with an
   exclusive put. That put is the commit point.

If step 2 or 3 fails the shard stays pending and the next flush retries it with the same keys and bytes,
so a retry is idempotent: an exclusive put that finds an identical record counts as success.
`writer_id` is `{writer}-{8 random hex digits}`: `writer` is the stable name of a rollout worker (its
state file and prompt claims use it), the suffix names this incarnation, so a restarted worker with the
same name never reuses a key of its earlier life and two processes never share keys.

Evicted groups (they failed validation at encode time, see `_encode_or_evict`) are counted in
`stats["evicted"]` and reported to `on_evict(n)`, so the rollout credits them back to its capacity.

What this is NOT: a reader, or async. Flushes block; call them from a worker thread in an event loop.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.parquet as pq

from storage import keys
from storage.commits import CommitRecord, partition_version
from storage.errors import CommitConflictError, InvalidTrajectoryError, SchemaMismatchError
from storage.fs import Storage
from storage.schema import SCHEMA_VERSION, TrajectoryGroup, groups_to_table

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    data: bytes
    record: CommitRecord
    shard_written: bool = False


class ShardWriter:
    """Buffer groups; flush when `flush_rows` rows are buffered or the oldest is `flush_seconds` old."""

    def __init__(
        self,
        storage: Storage,
        writer: str,
        *,
        flush_rows: int = 256,
        flush_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        compression: str = "snappy",
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows}")
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds}")
        keys.check_name(writer, "writer")
        self.storage = storage
        self.writer_id = f"{writer}-{uuid.uuid4().hex[:8]}"
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.compression = compression
        self._clock = clock
        self._lock = threading.RLock()
        self._buffer: list[TrajectoryGroup] = []
        self._buffer_rows = 0
        self._buffer_since: float | None = None
        self._pending: _Pending | None = None
        self._seq = 0
        self._closed = False
        self._on_evict = on_evict
        self.stats: dict[str, int] = {"rows": 0, "groups": 0, "shards": 0, "evicted": 0}

    @property
    def buffered_groups(self) -> int:
        return len(self._buffer)

    def add(self, group: TrajectoryGroup) -> CommitRecord | None:
        """Buffer one group; flush (and return its record) if the buffer reached `flush_rows` or its age."""
        group._check_structure()
        with self._lock:
            if self._closed:
                raise RuntimeError("ShardWriter is closed")
            if not self._buffer:
                self._buffer_since = self._clock()
            self._buffer.append(group)
            self._buffer_rows += len(group.rows)
            if self._buffer_rows >= self.flush_rows or self._age() >= self.flush_seconds:
                return self.flush()
            return None

    def _age(self) -> float:
        return 0.0 if self._buffer_since is None else self._clock() - self._buffer_since

    def maybe_flush(self) -> CommitRecord | None:
        """Flush if the oldest buffered group is at least `flush_seconds` old (or a retry is pending)."""
        with self._lock:
            if self._pending is not None or (self._buffer and self._age() >= self.flush_seconds):
                return self.flush()
            return None

    def flush(self) -> CommitRecord | None:
        """Commit the buffer (after any pending retry). Returns the last record committed, or None."""
        with self._lock:
            record = None
            if self._pending is not None:
                record = self._commit(self._pending)
            if self._buffer:
                self._pending = self._encode_or_evict()
                self._buffer, self._buffer_rows, self._buffer_since = [], 0, None
                record = self._commit(self._pending)
            return record

    def _encode_or_evict(self) -> _Pending:
        """Encode the buffer; if it fails validation, evict the offending groups and raise.

        Validation is vectorised over the whole buffer, so a bad group is only found here. Evicting it
        keeps one bad group from blocking every later flush; the good groups stay buffered.
        """
        try:
            return self._encode(self._buffer)
        except (SchemaMismatchError, InvalidTrajectoryError) as first:
            bad: list[tuple[TrajectoryGroup, Exception]] = []
            for g in self._buffer:
                try:
                    groups_to_table([g])
                except (SchemaMismatchError, InvalidTrajectoryError) as e:
                    bad.append((g, e))
            if not bad:
                raise
            self._buffer = [g for g in self._buffer if all(g is not b for b, _ in bad)]
            self._buffer_rows = sum(len(g.rows) for g in self._buffer)
            for g, e in bad:
                logger.error("dropping invalid group %s from writer %s: %s", g.group_id, self.writer_id, e)
            self.stats["evicted"] += len(bad)
            if self._on_evict is not None:
                self._on_evict(len(bad))
            g, e = bad[0]
            raise InvalidTrajectoryError(
                f"{len(bad)} invalid group(s) dropped from the buffer, first {g.group_id!r}: {e}"
            ) from first

    def close(self) -> None:
        """Flush what is buffered; afterwards `add` raises. Raises if the final commit fails."""
        with self._lock:
            if not self._closed:
                self.flush()
                self._closed = True

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------------------

    def _encode(self, groups: list[TrajectoryGroup]) -> _Pending:
        table = groups_to_table(groups, writer=self.writer_id)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression=self.compression)
        data = sink.getvalue()
        seq = self._seq
        self._seq += 1
        heads = [g.head_version for g in groups]
        min_head, max_head = min(heads), max(heads)
        record = CommitRecord(
            commit_id=keys.commit_id(self.writer_id, seq),
            key=keys.commit_key(partition_version(min_head), self.writer_id, seq),
            shard_key=keys.shard_key(self.writer_id, f"{seq:08d}"),
            rows=table.num_rows,
            groups=len(groups),
            min_head_version=min_head,
            max_head_version=max_head,
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            schema_version=SCHEMA_VERSION,
            writer=self.writer_id,
            seq=seq,
            created_at=time.time(),
        )
        return _Pending(data, record)

    def _commit(self, p: _Pending) -> CommitRecord:
        rec = p.record
        if not p.shard_written:
            self.storage.put_bytes(rec.shard_key, p.data)
            p.shard_written = True
        try:
            self.storage.put_bytes(rec.key, rec.to_bytes(), exclusive=True)
        except CommitConflictError:
            # A retry whose first attempt landed (e.g. the response was lost): same bytes means done.
            existing = self.storage.get_bytes(rec.key)
            if existing != rec.to_bytes():
                raise CommitConflictError(
                    f"commit {rec.commit_id} exists with different content at {rec.key}"
                ) from None
            logger.info("commit %s was already in place (retried put)", rec.commit_id)
        self._pending = None
        self.stats["rows"] += rec.rows
        self.stats["groups"] += rec.groups
        self.stats["shards"] += 1
        logger.debug(
            "committed %s: %d groups, %d rows, heads %d..%d, %d bytes",
            rec.commit_id,
            rec.groups,
            rec.rows,
            rec.min_head_version,
            rec.max_head_version,
            rec.size,
        )
        return rec
