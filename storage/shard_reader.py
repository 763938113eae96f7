"""`ShardReader`: takes committed trajectory groups oldest first, exactly once, and quarantines bad shards.

The reader trusts only commit records (a shard without one does not exist). Before a shard's groups are
used it checks, in order: size, sha256, Parquet decodability, schema + schema_version + per-row
invariants + finite values (`validate_table`), token ids against `vocab_size` when given, and that the
row/group counts match the record. Any failure to parse a record is quarantined too, naming its key, and
so is a record or shard that a symlink takes outside the trial root (`UnsafePathError`: never read). A shard failing any check
is quarantined: its record is copied, with the reason, to `trajectories/quarantine/{commit_id}.json`, the
error is logged at ERROR and counted, and the commit is marked consumed so it never blocks the reader.
The shard itself is left in place for a human. Transient I/O errors (anything but a missing key) are
raised, and leave the cursor untouched: `take` is all-or-nothing.

`ReaderCursor` is the exactly-once state: for each commit, how many of its groups were consumed (groups
are consumed in file order), and which of a partly consumed commit's groups were dropped as stale. The
trainer saves `cursor.to_json()` with its resume state and restores it with `ReaderCursor.from_json`, so
nothing is consumed twice and nothing is skipped.

Exactly once holds per group, not only per commit: the cursor remembers the id of every group it
delivered (and the commit it came in), and a later commit's group with an id already delivered is not
delivered again. It is consumed like a stale group (its commit's credit document counts it, so it holds no
staleness capacity and the prompt audit counts it once), logged at ERROR naming both commits, and counted
(`stats["duplicates"]`, `TakeResult.duplicates`). Two writers whose shards carry the same ids, a replayed
shard or a restored bucket version are caught this way. The memory is bounded by the staleness window:
when `take` is given `min_head_version`, ids delivered with a head version below it are forgotten, since a
group that old is dropped as stale whatever its id (a replay that carries a newer head version than its
original cannot be told from a new group). Without a staleness bound the newest `MAX_REMEMBERED_IDS`
delivered ids are kept.

Capacity credits (`storage.credits`): when `take` finishes a commit of which it dropped groups as stale,
it writes the commit's credit document; a quarantine document says how many groups were unconsumed. The
rollout's `GroupLedger` sums both, so groups that will never be trained stop holding staleness capacity.

Listing: `take` lists incrementally (`PartitionLister`: the newest partitions every poll, all of them
once per `sweep_s`), so a poll costs O(hot partitions) LIST requests, not O(all commits).

What this is NOT: a writer or a sampler; `take` is FIFO by (record.created_at, commit_id).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from storage import credits, keys
from storage.commits import CommitRecord
from storage.errors import CorruptShardError, SchemaMismatchError, UnsafePathError
from storage.fs import Storage
from storage.partition_lister import PartitionLister
from storage.schema import SCHEMA_VERSION, TrajectoryGroup, table_to_groups, validate_table
from storage.validate import check_token_ids, parse_commit_record

logger = logging.getLogger(__name__)

_COMMIT_ID_RE = re.compile(r"^(?P<writer>.+)-(?P<seq>\d{8,})$")


def _cid(record_key: str) -> str:
    """The commit id of a record key (its file name without `.json`)."""
    return record_key.rsplit("/", 1)[-1][: -len(".json")]


@dataclass
class TakeResult:
    """What one `take` produced."""

    groups: list[TrajectoryGroup]
    dropped_stale: int = 0  # groups consumed but not returned: head_version < min_head_version
    duplicates: int = 0  # groups consumed but not returned: their id was delivered before
    quarantined: int = 0  # commits quarantined during this take
    commit_latency_s: list[float] = field(default_factory=list)  # now - created_at, per commit first touched


class ReaderCursor:
    """Exactly-once consumption state: commit id -> number of its groups consumed (in file order).

    Fully consumed commits are kept as a set; `to_json` stores them as seq ranges per writer, so the
    saved cursor stays small over a long run.
    """

    FORMAT = 1
    MAX_REMEMBERED_IDS = 20_000  # delivered group ids kept when no staleness bound prunes them

    def __init__(self) -> None:
        self._partial: dict[str, int] = {}
        self._done: set[str] = set()
        self._dropped: dict[str, set[int]] = {}  # partly consumed commit -> indices dropped as stale
        # group id -> (commit it was delivered from, its head version), oldest delivery first
        self._delivered: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def delivered_in(self, group_id: str) -> str | None:
        """The commit a group with this id was delivered from, or None."""
        seen = self._delivered.get(group_id)
        return seen[0] if seen is not None else None

    def note_delivered(self, group_id: str, commit_id: str, head_version: int) -> None:
        self._delivered[group_id] = (commit_id, head_version)
        while len(self._delivered) > self.MAX_REMEMBERED_IDS:
            self._delivered.popitem(last=False)

    def forget_below(self, min_head_version: int) -> None:
        """Forget delivered ids whose head version is below ``min_head_version`` (module docstring)."""
        old = [g for g, (_, head) in self._delivered.items() if head < min_head_version]
        for g in old:
            del self._delivered[g]

    def position(self, commit_id: str) -> int | None:
        """Groups of `commit_id` consumed so far (0 if untouched), or None once it is fully consumed."""
        return None if commit_id in self._done else self._partial.get(commit_id, 0)

    def consumed(self, commit_id: str, total: int) -> int:
        """Groups of `commit_id` consumed so far, given its total (from the record)."""
        p = self.position(commit_id)
        return total if p is None else p

    @property
    def n_done(self) -> int:
        """Number of fully consumed (or quarantined) commits."""
        return len(self._done)

    def is_done(self, commit_id: str) -> bool:
        return commit_id in self._done

    def advance(self, commit_id: str, n: int, total: int) -> None:
        """Record `n` more groups of `commit_id` consumed; done once `total` are."""
        if commit_id in self._done:
            raise ValueError(f"commit {commit_id} is already fully consumed")
        k = self._partial.get(commit_id, 0) + n
        if k >= total:
            self.finish(commit_id)
        else:
            self._partial[commit_id] = k

    def finish(self, commit_id: str) -> None:
        """Mark a commit fully consumed (also used for quarantined ones)."""
        self._partial.pop(commit_id, None)
        self._dropped.pop(commit_id, None)
        self._done.add(commit_id)

    def dropped(self, commit_id: str) -> set[int]:
        """Indices of `commit_id`'s groups dropped as stale so far (only kept while it is partly consumed)."""
        return set(self._dropped.get(commit_id, ()))

    def note_dropped(self, commit_id: str, indices: set[int]) -> None:
        """Remember stale drops of a commit that stays partly consumed (saved with the cursor)."""
        if indices:
            self._dropped.setdefault(commit_id, set()).update(indices)

    def update(self, other: ReaderCursor) -> None:
        """Replace this cursor's state with `other`'s (in place, so references stay valid)."""
        self._partial = dict(other._partial)
        self._done = set(other._done)
        self._dropped = {k: set(v) for k, v in other._dropped.items()}
        self._delivered = OrderedDict(other._delivered)

    def copy(self) -> ReaderCursor:
        c = ReaderCursor()
        c.update(self)
        return c

    def __len__(self) -> int:
        return len(self._partial) + len(self._done)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ReaderCursor)
            and self._partial == other._partial
            and self._done == other._done
            and self._dropped == other._dropped
            and self._delivered == other._delivered
        )

    def __repr__(self) -> str:
        return f"ReaderCursor(done={len(self._done)}, partial={len(self._partial)})"

    def to_json(self) -> dict[str, Any]:
        by_writer: dict[str, list[int]] = defaultdict(list)
        odd: list[str] = []
        for cid in self._done:
            m = _COMMIT_ID_RE.match(cid)
            if m:
                by_writer[m.group("writer")].append(int(m.group("seq")))
            else:
                odd.append(cid)
        done: dict[str, list[list[int]]] = {}
        for w, seqs in by_writer.items():
            seqs.sort()
            ranges: list[list[int]] = []
            for s in seqs:
                if ranges and s == ranges[-1][1] + 1:
                    ranges[-1][1] = s
                else:
                    ranges.append([s, s])
            done[w] = ranges
        return {
            "format": self.FORMAT,
            "done": dict(sorted(done.items())),
            "done_ids": sorted(odd),
            "partial": dict(sorted(self._partial.items())),
            "partial_dropped": {k: sorted(v) for k, v in sorted(self._dropped.items()) if v},
            # [group id, commit id, head version], oldest delivery first
            "delivered": [[g, c, h] for g, (c, h) in self._delivered.items()],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ReaderCursor:
        if not isinstance(obj, dict) or obj.get("format") != cls.FORMAT:
            raise ValueError(f"not a ReaderCursor v{cls.FORMAT} document")
        c = cls()
        for w, ranges in obj.get("done", {}).items():
            for lo, hi in ranges:
                c._done.update(keys.commit_id(w, s) for s in range(int(lo), int(hi) + 1))
        c._done.update(str(x) for x in obj.get("done_ids", []))
        for cid, n in obj.get("partial", {}).items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"cursor: bad count for {cid!r}: {n!r}")
            c._partial[str(cid)] = n
        for cid, idx in obj.get("partial_dropped", {}).items():
            if not isinstance(idx, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in idx):
                raise ValueError(f"cursor: bad dropped indices for {cid!r}: {idx!r}")
            c._dropped[str(cid)] = set(idx)
        for item in obj.get("delivered", []):  # absent in cursors saved before ids were remembered
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], int)):
                raise ValueError(f"cursor: bad delivered entry {item!r}")
            c._delivered[str(item[0])] = (str(item[1]), int(item[2]))
        return c


class ShardReader:
    """Lists commit records and takes their groups oldest first, advancing `cursor`."""

    def __init__(
        self,
        storage: Storage,
        cursor: ReaderCursor | None = None,
        *,
        clock: Callable[[], float] = time.time,
        vocab_size: int | None = None,
        hot_window: int = 8,
        sweep_s: float = 60.0,
    ) -> None:
        """`hot_window`/`sweep_s`: see `PartitionLister` (how `take` lists; `list_commits` lists fully)."""
        self.storage = storage
        self.vocab_size = vocab_size  # token ids >= this quarantine the shard (None: not checked)
        self.cursor = cursor if cursor is not None else ReaderCursor()
        self._clock = clock
        self.lister = PartitionLister(storage, keys.COMMIT_DIR, hot_window=hot_window, sweep_s=sweep_s)
        self._open_keys: set[str] = set()  # listed record keys whose commit is not fully consumed
        self._records: dict[str, CommitRecord] = {}  # record key -> record (records are immutable)
        self._bad_keys: set[str] = set()  # record keys already quarantined as unreadable
        self._decoded: OrderedDict[str, list[TrajectoryGroup]] = OrderedDict()  # commit id -> groups
        self.stats: dict[str, int] = {
            "groups_read": 0,
            "dropped_stale": 0,
            "duplicates": 0,
            "quarantined": 0,
            "commits_seen": 0,
        }

    # --- listing ------------------------------------------------------------------------------------------

    def _record_keys(self, min_version: int | None, max_version: int | None) -> list[str]:
        if min_version is None and max_version is None:
            return [k for k in self.storage.list(keys.COMMIT_DIR) if k.endswith(".json")]
        out: list[str] = []
        for d in self.storage.list_dirs(keys.COMMIT_DIR):
            v = keys.parse_version_dir(d)
            if v is None:
                continue
            if (min_version is not None and v < min_version) or (max_version is not None and v > max_version):
                continue
            out += [k for k in self.storage.list(d) if k.endswith(".json")]
        return out

    def _read_records(
        self, key_list: list[str], include_consumed: bool, cursor: ReaderCursor, result: TakeResult | None
    ) -> list[CommitRecord]:
        records: list[CommitRecord] = []
        for key in key_list:
            cid = _cid(key)
            if key in self._bad_keys or (not include_consumed and cursor.is_done(cid)):
                continue
            rec = self._records.get(key)
            if rec is None:
                try:
                    raw = self.storage.get_bytes(key)
                    rec = parse_commit_record(raw, key)
                except FileNotFoundError:
                    continue  # deleted between list and get
                except (CorruptShardError, UnsafePathError) as e:  # unparseable, or a link out of the root
                    self._quarantine(cid, key, None, f"unreadable commit record: {e}", cursor, result)
                    self._bad_keys.add(key)
                    continue
                self._records[key] = rec
            records.append(rec)
        records.sort(key=lambda r: (r.created_at, r.commit_id))
        return records

    def list_commits(
        self,
        min_version: int | None = None,
        max_version: int | None = None,
        include_consumed: bool = False,
    ) -> list[CommitRecord]:
        """Records with min_version <= min_head_version <= max_version, oldest first.

        Only the partitions in range are listed. Unreadable records are quarantined on the way.
        """
        return self._read_records(
            self._record_keys(min_version, max_version), include_consumed, self.cursor, None
        )

    def count_committed_groups(self) -> int:
        """Total groups across all readable commit records, consumed or not (rollout restart accounting)."""
        return sum(r.groups for r in self.list_commits(include_consumed=True))

    # --- taking -------------------------------------------------------------------------------------------

    def take(self, n_groups: int, *, min_head_version: int | None = None) -> TakeResult:
        """Up to `n_groups` groups, oldest first, advancing the cursor.

        Groups with head_version < min_head_version are consumed and dropped (counted, never returned).
        All-or-nothing: if a transient error is raised, the cursor is unchanged.
        """
        result = TakeResult(groups=[])
        if n_groups <= 0:
            return result
        cursor = self.cursor.copy()
        stats_before = dict(self.stats)
        try:
            self._take(n_groups, min_head_version, cursor, result)
        except BaseException:
            self.stats = stats_before
            raise
        self.cursor.update(cursor)
        self.stats["groups_read"] += len(result.groups)
        self.stats["dropped_stale"] += result.dropped_stale
        self.stats["duplicates"] += result.duplicates
        return result

    def _take(self, n: int, min_head: int | None, cursor: ReaderCursor, result: TakeResult) -> None:
        if min_head is not None:
            cursor.forget_below(min_head)
        self._open_keys.update(self.lister.poll())
        records = self._read_records(sorted(self._open_keys), False, cursor, result)
        now = self._clock()
        for rec in records:
            if len(result.groups) >= n:
                break
            done = cursor.position(rec.commit_id)
            if done is None:
                continue
            if done == 0:
                self.stats["commits_seen"] += 1
                result.commit_latency_s.append(max(0.0, now - rec.created_at))
            if min_head is not None and rec.max_head_version < min_head:
                # Every remaining group is stale: drop them from the record alone, no download.
                result.dropped_stale += rec.groups - done
                self._finish(rec, cursor, cursor.dropped(rec.commit_id) | set(range(done, rec.groups)))
                continue
            try:
                groups = self._load(rec)
            except CorruptShardError as e:
                self._quarantine(rec.commit_id, rec.key, rec, str(e), cursor, result)
                continue
            i = done
            dropped: set[int] = set()
            while i < len(groups) and len(result.groups) < n:
                g = groups[i]
                first = cursor.delivered_in(g.group_id)
                if min_head is not None and g.head_version < min_head:
                    result.dropped_stale += 1
                    dropped.add(i)
                elif first is not None:
                    result.duplicates += 1
                    dropped.add(i)  # credited like a stale group: never trained, holds no capacity
                    logger.error(
                        "group %s of commit %s (index %d) was already delivered from commit %s: not delivered "
                        "again (a writer reusing ids, a replayed shard or a restored bucket version?)",
                        g.group_id, rec.commit_id, i, first,
                    )  # fmt: skip
                else:
                    cursor.note_delivered(g.group_id, rec.commit_id, g.head_version)
                    result.groups.append(g)
                i += 1
            if i >= rec.groups:
                self._finish(rec, cursor, cursor.dropped(rec.commit_id) | dropped)
            else:
                cursor.advance(rec.commit_id, i - done, rec.groups)
                cursor.note_dropped(rec.commit_id, dropped)
        self._open_keys = {k for k in self._open_keys if not cursor.is_done(_cid(k))}

    def _finish(self, rec: CommitRecord, cursor: ReaderCursor, dropped: set[int]) -> None:
        """Mark `rec` consumed; if any of its groups were dropped as stale, write its credit document."""
        if dropped:
            self.storage.put_json(
                credits.credit_key(rec.partition, rec.commit_id), credits.credit_doc(rec.commit_id, dropped)
            )
        cursor.finish(rec.commit_id)
        self._decoded.pop(rec.commit_id, None)

    def _load(self, rec: CommitRecord) -> list[TrajectoryGroup]:
        """Decoded groups of a verified shard (cached while partially consumed); CorruptShardError if bad."""
        cached = self._decoded.get(rec.commit_id)
        if cached is not None:
            return cached
        if rec.schema_version != SCHEMA_VERSION:
            raise CorruptShardError(
                f"foreign schema_version {rec.schema_version} in record (this reader: {SCHEMA_VERSION})"
            )
        try:
            data = self.storage.get_bytes(rec.shard_key)
        except FileNotFoundError:
            raise CorruptShardError(f"shard {rec.shard_key} named by the record is missing") from None
        except (IsADirectoryError, NotADirectoryError):
            raise CorruptShardError(f"shard {rec.shard_key} named by the record is not a file") from None
        except UnsafePathError as e:
            raise CorruptShardError(f"shard named by the record is not read: {e}") from None
        if len(data) != rec.size:
            raise CorruptShardError(f"shard size {len(data)} != {rec.size} in the record (truncated?)")
        digest = hashlib.sha256(data).hexdigest()
        if digest != rec.sha256:
            raise CorruptShardError(f"shard sha256 {digest[:16]}... != {rec.sha256[:16]}... in the record")
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise CorruptShardError(f"shard is not readable Parquet: {e}") from None
        try:
            validate_table(table, expected_version=SCHEMA_VERSION)
            if self.vocab_size is not None:
                check_token_ids(table, self.vocab_size)
        except SchemaMismatchError as e:
            raise CorruptShardError(f"foreign or invalid shard: {e}") from None
        groups = table_to_groups(table)
        if table.num_rows != rec.rows or len(groups) != rec.groups:
            raise CorruptShardError(
                f"shard has {table.num_rows} rows / {len(groups)} groups, record says {rec.rows} / {rec.groups}"
            )
        self._decoded[rec.commit_id] = groups
        while len(self._decoded) > 4:
            self._decoded.popitem(last=False)
        return groups

    def _quarantine(
        self,
        commit_id: str,
        record_key: str,
        rec: CommitRecord | None,
        reason: str,
        cursor: ReaderCursor,
        result: TakeResult | None,
    ) -> None:
        try:
            qkey = keys.quarantine_key(commit_id)
        except ValueError:
            qkey = keys.quarantine_key("bad-" + hashlib.sha256(commit_id.encode()).hexdigest()[:16])
        # Credit: the groups not consumed yet, plus those of them already dropped as stale.
        credit = 0
        if rec is not None:
            credit = rec.groups - cursor.consumed(commit_id, rec.groups) + len(cursor.dropped(commit_id))
        self.storage.put_json(
            qkey,
            {
                "commit_id": commit_id,
                "record_key": record_key,
                "record": rec.to_json() if rec is not None else None,
                "credit": credit,
                "reason": reason,
                "quarantined_at": time.time(),
            },
        )
        logger.error(
            "quarantined commit %s (record %s, shard %s): %s; the shard is left in place, see %s",
            commit_id,
            record_key,
            rec.shard_key if rec is not None else "?",
            reason,
            qkey,
        )
        cursor.finish(commit_id)
        self._decoded.pop(commit_id, None)
        self.stats["quarantined"] += 1
        if result is not None:
            result.quarantined += 1
