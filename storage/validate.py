"""Value checks on trajectory data and commit records at the storage boundary (write and read).

What it is: pure functions that turn bad values into the storage layer's named errors, so nothing
downstream (the float32 shard, the trainer's embedding lookup, the JSON parser) meets them:

- `check_values(table)`: rewards and behaviour logprobs are finite in float32 (a reward of 1e39 is
  stored as inf, so it is refused, not silently converted); token ids are >= 0. Called by
  `schema.validate_table`, hence on every write and every read.
- `check_token_ids(table, vocab_size)`: token ids are < the policy's vocabulary (the reader knows it,
  the writer does not). A shard failing it is quarantined by the reader, not fed to the trainer.
- `parse_commit_record(raw, key)`: any failure to parse a commit record (bad UTF-8, bad JSON, JSON
  nested deeper than the parser's recursion limit, wrong fields) becomes one CorruptShardError that
  names the record's key.

What it is NOT: the schema (names, types, per-row invariants: `schema.py`) or the commit protocol.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.commits import CommitRecord
from storage.errors import CorruptShardError, NonFiniteValueError, SchemaMismatchError

FLOAT32_MAX = float(np.finfo(np.float32).max)  # 3.4028235e38


def _traj_id(table: pa.Table, row: int) -> str:
    return repr(table.column("traj_id")[row].as_py())


def _row_of(offsets: np.ndarray, flat_index: int) -> int:
    """The row whose slice [offsets[i], offsets[i+1]) holds `flat_index` of the flattened list column."""
    return int(np.searchsorted(offsets, flat_index, side="right") - 1)


def check_values(table: pa.Table) -> None:
    """NonFiniteValueError if a reward or behaviour logprob is NaN / +-inf (in float32); a
    SchemaMismatchError if a token id is negative. The message names the row and the fix.
    """
    reward = table.column("reward").to_numpy()
    bad = np.flatnonzero(~np.isfinite(reward))
    if bad.size:
        i = int(bad[0])
        raise NonFiniteValueError(
            "reward",
            f"row {i} ({_traj_id(table, i)}): {reward[i]} is not a finite float32 (NaN, inf, or beyond "
            f"+-{FLOAT32_MAX:.4g}, e.g. 1e39); {bad.size} row(s) affected. Bound rewards in the reward "
            "function",
        )
    arr = table.column("logprobs").combine_chunks()
    if len(arr):
        values = arr.values.to_numpy(zero_copy_only=False)
        offsets = arr.offsets.to_numpy()
        bad = np.flatnonzero(~np.isfinite(values[offsets[0] : offsets[-1]]))
        if bad.size:
            k = int(bad[0]) + int(offsets[0])
            i = _row_of(offsets, k)
            raise NonFiniteValueError(
                "logprobs",
                f"row {i} ({_traj_id(table, i)}), token {k - int(offsets[i])}: {values[k]} is not finite "
                f"({bad.size} value(s) affected); behaviour logprobs must be finite at every position "
                "(0.0 where loss_mask is 0)",
            )
    ids = pc.list_flatten(table.column("input_ids").combine_chunks())
    if len(ids) and pc.min(ids).as_py() < 0:
        raise SchemaMismatchError("input_ids", f"negative token id {pc.min(ids).as_py()}")


def check_token_ids(table: pa.Table, vocab_size: int) -> None:
    """SchemaMismatchError if any token id is outside [0, vocab_size)."""
    arr = table.column("input_ids").combine_chunks()
    if not len(arr):
        return
    offsets = arr.offsets.to_numpy()
    flat = arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    bad = np.flatnonzero((flat < 0) | (flat >= vocab_size))
    if bad.size:
        k = int(bad[0]) + int(offsets[0])
        i = _row_of(offsets, k)
        raise SchemaMismatchError(
            "input_ids",
            f"row {i} ({_traj_id(table, i)}): token id {int(flat[bad[0]])} is outside the policy's "
            f"vocabulary [0, {vocab_size}) ({bad.size} id(s) affected); the shard was written for "
            "another tokenizer or is corrupt",
        )


def parse_commit_record(raw: bytes, key: str) -> CommitRecord:
    """The validated record stored at `key`; CorruptShardError naming `key` for any parse failure."""
    try:
        rec = CommitRecord.from_json(json.loads(raw))
    except CorruptShardError as e:
        raise CorruptShardError(f"commit record {key}: {e}") from None
    except RecursionError:
        raise CorruptShardError(f"commit record {key}: JSON nested too deeply to parse") from None
    except (ValueError, TypeError, KeyError, OverflowError, MemoryError) as e:
        # ValueError covers bad JSON and bad UTF-8 (UnicodeDecodeError); the rest, odd values.
        raise CorruptShardError(
            f"commit record {key}: not a valid record ({type(e).__name__}: {e})"
        ) from None
    if rec.key != key:
        raise CorruptShardError(f"commit record stored at {key} names itself {rec.key}")
    return rec
