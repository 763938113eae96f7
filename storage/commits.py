"""`CommitRecord`: the small JSON document that makes a trajectory shard exist.

Protocol (delta-rs style): the shard is written first, in one put; then its record is written with an
exclusive put under a key unique to (writer, seq). Readers trust only records, so a shard without a record
does not exist, and a record names exactly one immutable shard with its size and sha256. The shard's key
is derived from (writer, seq) too, so no two records can name one shard.

A record may also name the rollout loop's prompt positions of its groups (`positions`, in file order):
what a resumed worker reads to know which of its open prompts were committed before a kill, so none is
generated twice. Records without it (older writers, writers outside the loop) omit the field.

This module is the record's format and validation only; it does no I/O (see `shard_writer`,
`shard_reader`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from storage import keys
from storage.errors import CorruptShardError

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def partition_version(min_head_version: int) -> int:
    """Partition of a commit: its min head version, clamped at 0 (rows without policy tokens have -1)."""
    return max(int(min_head_version), 0)


@dataclass(frozen=True)
class CommitRecord:
    """What a reader needs to find, check and order a shard without opening it."""

    commit_id: str  # "{writer}-{seq:08d}"
    key: str  # this record's own key: trajectories/commits/v{partition:06d}/{commit_id}.json
    shard_key: str  # trajectories/data/{writer}-{uid}.parquet
    rows: int
    groups: int
    min_head_version: int
    max_head_version: int
    sha256: str  # hex sha256 of the shard bytes
    size: int  # shard size in bytes
    schema_version: int
    writer: str
    seq: int
    created_at: float  # unix seconds, writer's clock
    positions: tuple[int, ...] | None = None  # prompt positions of the groups, in file order, if known

    @property
    def partition(self) -> int:
        return partition_version(self.min_head_version)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.positions is None:
            del doc["positions"]  # the bytes of a record without positions are those of older writers
        else:
            doc["positions"] = list(self.positions)
        return doc

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, obj: Any) -> CommitRecord:
        """Parse and validate; CorruptShardError says which field is wrong."""
        if not isinstance(obj, dict):
            raise CorruptShardError(f"commit record is not a JSON object: {type(obj).__name__}")
        types: dict[str, tuple[type, ...]] = {
            "commit_id": (str,),
            "key": (str,),
            "shard_key": (str,),
            "rows": (int,),
            "groups": (int,),
            "min_head_version": (int,),
            "max_head_version": (int,),
            "sha256": (str,),
            "size": (int,),
            "schema_version": (int,),
            "writer": (str,),
            "seq": (int,),
            "created_at": (int, float),
        }
        for name, ok in types.items():
            if name not in obj:
                raise CorruptShardError(f"commit record lacks field {name!r}")
            v = obj[name]
            if isinstance(v, bool) or not isinstance(v, ok):
                raise CorruptShardError(f"commit record field {name!r} has type {type(v).__name__}")
        positions = obj.get("positions")
        if positions is not None and (
            not isinstance(positions, list)
            or any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in positions)
        ):
            raise CorruptShardError("commit record field 'positions' is not a list of ints >= 0")
        rec = cls(**{k: obj[k] for k in types}, positions=None if positions is None else tuple(positions))
        rec.validate()
        return rec

    def validate(self) -> None:
        def bad(msg: str) -> CorruptShardError:
            return CorruptShardError(f"commit record {self.commit_id!r}: {msg}")

        try:
            expected_id = keys.commit_id(self.writer, self.seq)
            expected_key = keys.commit_key(self.partition, self.writer, self.seq)
        except ValueError as e:
            raise bad(str(e)) from None
        if self.commit_id != expected_id:
            raise bad(f"commit_id != writer-seq ({expected_id!r})")
        if self.key != expected_key:
            raise bad(f"key {self.key!r} != {expected_key!r}")
        # The shard key is derived from (writer, seq) like the record key, so two records (each unique
        # by its exclusive put) can never name the same shard and deliver its groups twice.
        expected_shard = keys.shard_key(self.writer, f"{self.seq:08d}")
        if self.shard_key != expected_shard:
            raise bad(
                f"shard_key {self.shard_key!r} != {expected_shard!r}: a record names only its own "
                "writer's shard (a second record for an already-committed shard is refused)"
            )
        if not _SHA256_RE.match(self.sha256):
            raise bad("sha256 is not 64 lowercase hex digits")
        if self.size <= 0 or self.rows < 1 or self.groups < 1 or self.groups > self.rows:
            raise bad(f"impossible counts: size={self.size} rows={self.rows} groups={self.groups}")
        if self.min_head_version > self.max_head_version:
            raise bad("min_head_version > max_head_version")
        if self.positions is not None and len(self.positions) != self.groups:
            raise bad(f"{len(self.positions)} positions for {self.groups} groups")
