"""Value checks on trajectory data and commit records at the storage boundary (write and read).

What it is: pure functions that turn bad values into the storage layer's named errors, so nothing
downstream (the float32 shard, the trainer's embedding lookup, the JSON parser) meets them:

- `check_values(table)`: rewards and behaviour logprobs are finite in float32 (a reward of 1e39 is
  stored as inf, so it is refused, not silently converted); token ids are >= 0. Called by
  `schema.validate_table`, hence on every write and every read.
- `check_token_ids(table, vocab_size)`: token ids are < the policy's vocabulary (the reader knows it,
  the writer does not). A shard failing it is quarantined by the reader, not fed to the trainer.
- `check_version_ceiling(table, ceiling)`: no trained token is newer than `ceiling`, the newest policy
  version that existed when the shard was written (the writer knows it, see `ShardWriter`). Negative
  versions on trained tokens are refused by the schema (`schema.validate_table`) on write and read.
- `parse_commit_record(raw, key)`: any failure to parse a commit record (bad UTF-8, bad JSON, JSON
  nested deeper than the parser's recursion limit, wrong fields) becomes one CorruptShardError that
  names the record's key.

What it is NOT: the schema (names, types, per-row invariants: `schema.py`) or the commit protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from storage.commits import CommitRecord
from storage.errors import (
    CorruptShardError,
    ImpossibleVersionError,
    NonFiniteValueError,
    SchemaMismatchError,
)

FLOAT32_MAX = float(np.finfo(np.float32).max)  # 3.4028235e38


def _traj_id(table: pa.Table, row: int) -> str:
    return repr(table.column("traj_id")[row].as_py())


def _first_bad(
    table: pa.Table, column: str, is_bad: Callable[[np.ndarray], np.ndarray]
) -> tuple[int, int, float, int] | None:
    """(row, token position, value, number of bad values) of the first value of list `column` for
    which `is_bad` (vectorised over the flat values) holds, or None if there is none.
    """
    arr = table.column(column).combine_chunks()
    if not len(arr):
        return None
    offsets = arr.offsets.to_numpy()  # [rows + 1] respects a slice offset; .values does not
    values = arr.values.to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(is_bad(values[offsets[0] : offsets[-1]]))
    if not bad.size:
        return None
    k = int(bad[0]) + int(offsets[0])
    row = int(np.searchsorted(offsets, k, side="right") - 1)
    return row, k - int(offsets[row]), values[k].item(), int(bad.size)


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
    found = _first_bad(table, "logprobs", lambda v: ~np.isfinite(v))
    if found:
        i, t, value, n = found
        raise NonFiniteValueError(
            "logprobs",
            f"row {i} ({_traj_id(table, i)}), token {t}: {value} is not finite ({n} value(s) affected); "
            "behaviour logprobs must be finite at every position (0.0 where loss_mask is 0)",
        )
    found = _first_bad(table, "input_ids", lambda v: v < 0)
    if found:
        i, t, value, n = found
        raise SchemaMismatchError(
            "input_ids", f"row {i} ({_traj_id(table, i)}), token {t}: negative token id {value}"
        )


def check_token_ids(table: pa.Table, vocab_size: int) -> None:
    """SchemaMismatchError if any token id is outside [0, vocab_size)."""
    found = _first_bad(table, "input_ids", lambda v: (v < 0) | (v >= vocab_size))
    if found:
        i, _, value, n = found
        raise SchemaMismatchError(
            "input_ids",
            f"row {i} ({_traj_id(table, i)}): token id {value} is outside the policy's vocabulary "
            f"[0, {vocab_size}) ({n} id(s) affected); the shard was written for another tokenizer or "
            "is corrupt",
        )


def check_version_ceiling(table: pa.Table, ceiling: int) -> None:
    """ImpossibleVersionError if a row's newest trained token (its `tail_version`, which the schema
    checks is the max of `versions` over loss tokens) is newer than `ceiling`.

    Example: ceiling 5 (LATEST names v5): a row with tail_version 6 or 2**31 - 1 is refused.
    """
    tail = table.column("tail_version").to_numpy()
    bad = np.flatnonzero(tail > ceiling)
    if bad.size:
        i = int(bad[0])
        raise ImpossibleVersionError(
            "versions",
            f"row {i} ({_traj_id(table, i)}): a trained token has version {int(tail[i])}, but the newest "
            f"policy published when the shard was written is v{ceiling} ({bad.size} row(s) affected). "
            "Record the version of the weights that generated each token (the server's served version)",
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
