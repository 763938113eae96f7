"""Loading a committed checkpoint's safetensors in one read, verified before anything can use them.

What it is: ``read_safetensors_hashed(path, algo)`` parses a safetensors file (8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and ``data_offsets``, then the tensor bytes,
contiguous) and reads each tensor's bytes once, straight into the memory of a fresh tensor, while a
second thread hashes the same memory (``storage.read_hashed.HashingReader``). It returns the tensors and
the file's digest. ``load_verified_safetensors(path, expect, algo, name)`` compares that digest with the
file's COMMIT.json entry and returns the tensors only if it matches (``CheckpointIntegrityError`` naming
the file otherwise, and the tensors are dropped): weights whose digest differs never reach a model.
``load_verified_dir(dir, files, algo)`` does that for every weight file of a checkpoint directory
(``model.safetensors`` or the shards its index names; config and index bytes checked too).

Why: the older path hashed every file in place (``CheckpointStore.verified_dir``) and then read it again
to load it. Here each byte is read once, and the hash runs on a second core beside the read:

    t(load) ~= max(t(read into memory), t(hash))  instead of  t(hash) + t(read)

A header the reader cannot trust is refused (``CheckpointIntegrityError``) before any tensor is built:
a header over 100 MB, unknown dtypes, offsets that do not tile the data exactly, a size that disagrees.

What it is not: a general safetensors reader (no lazy slices, no device placement: the tensors are on
the CPU, in the file's dtype) or a check of what the tensors hold (shape against a model, finiteness:
the CPU server does those, ``infra.cpu_server.weights``). No pickle anywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from storage.checkpoint_commit import SHARD_INDEX_NAME, check_digest
from storage.errors import CheckpointIntegrityError
from storage.read_hashed import HashingReader, read_verified
from storage.transfer import FileDigest

WEIGHTS_NAME = "model.safetensors"
_MAX_HEADER = 100 * 2**20  # safetensors' own limit
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def _header(reader: HashingReader) -> list[tuple[str, torch.dtype, list[int], int, int]]:
    """``(name, dtype, shape, start, end)`` per tensor, ordered by ``start``; refuses an untrustworthy header."""
    name = reader.name
    if reader.size < 8:
        raise CheckpointIntegrityError(name, "too short for a safetensors file")
    n8 = bytearray(8)
    reader.readinto(n8)
    n = int.from_bytes(n8, "little")
    if n > min(_MAX_HEADER, reader.size - 8):
        raise CheckpointIntegrityError(name, f"safetensors header length {n} is impossible")
    raw = bytearray(n)
    reader.readinto(raw)
    try:
        doc = json.loads(bytes(raw))
    except (ValueError, RecursionError) as e:
        raise CheckpointIntegrityError(name, f"safetensors header is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointIntegrityError(name, "safetensors header is not a JSON object")
    out = []
    for key, info in doc.items():
        if key == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointIntegrityError(name, f"tensor {key!r}: bad header entry") from None
        nbytes = math.prod(shape) * dtype.itemsize
        if min(shape, default=0) < 0 or start < 0 or end - start != nbytes:
            raise CheckpointIntegrityError(name, f"tensor {key!r}: offsets do not match its shape and dtype")
        out.append((key, dtype, shape, start, end))
    out.sort(key=lambda e: e[3])
    pos = 0
    for key, _, _, start, end in out:  # the data must be tiled exactly: no gap, no overlap
        if start != pos:
            raise CheckpointIntegrityError(name, f"tensor {key!r} starts at {start}, expected {pos}")
        pos = end
    if 8 + n + pos != reader.size:
        raise CheckpointIntegrityError(name, f"holds {reader.size} bytes, its header describes {8 + n + pos}")
    return out


def read_safetensors_hashed(
    path: str | Path, algo: str, name: str | None = None, into: Mapping[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], FileDigest]:
    """Every tensor of ``path`` (CPU memory, the file's dtypes) and the digest of the file, one read.

    ``into``: tensors to read into where one has the name, dtype and shape and is a contiguous CPU tensor
    (a standby copy of the model, memory already touched: filling fresh memory costs more than the read
    itself on some hosts); the others get fresh memory. Their old contents are gone whatever the digest,
    so ``into`` must be memory nothing uses until the caller has checked the digest.
    """
    try:
        reader = HashingReader(path, algo, name)
    except FileNotFoundError:
        raise CheckpointIntegrityError(name or Path(path).name, "missing from storage") from None
    into = into or {}
    with reader:
        tensors: dict[str, torch.Tensor] = {}
        for key, dtype, shape, start, end in _header(reader):
            t = into.get(key)
            if t is None or t.dtype != dtype or list(t.shape) != shape or t.device.type != "cpu":
                t = torch.empty(shape, dtype=dtype)
            if not t.is_contiguous():
                t = torch.empty(shape, dtype=dtype)
            if end > start:
                reader.readinto(t.detach().reshape(-1).view(torch.uint8).numpy())  # [bytes], t's memory
            tensors[key] = t
        return tensors, reader.finish()


def load_verified_safetensors(
    path: str | Path,
    expect: Mapping[str, Any],
    algo: str,
    name: str,
    into: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of ``path``, only if its size and digest match ``expect`` (its COMMIT.json entry)."""
    tensors, digest = read_safetensors_hashed(path, algo, name, into)
    check_digest(name, digest, expect, algo)
    return tensors


def weight_files(directory: Path, files: Mapping[str, Any], algo: str) -> list[str]:
    """The safetensors files a loader reads: the shards the (verified) index names, else model.safetensors."""
    if SHARD_INDEX_NAME in files:
        index = json.loads(
            read_verified(directory / SHARD_INDEX_NAME, files[SHARD_INDEX_NAME], algo, SHARD_INDEX_NAME)
        )
        shards = sorted(set(index["weight_map"].values()))
    else:
        shards = [WEIGHTS_NAME]
    missing = [s for s in shards if s not in files]
    if missing:
        raise CheckpointIntegrityError(missing[0], "needed by the checkpoint; not in COMMIT.json")
    return shards


def load_verified_dir(
    directory: str | Path,
    files: Mapping[str, Any],
    algo: str,
    into: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, each weight file read once and checked against ``files``
    (COMMIT.json's ``{name: {size, <algo>}}``); CheckpointIntegrityError naming the first that differs.
    ``into``: as for ``read_safetensors_hashed``."""
    directory = Path(directory)
    out: dict[str, torch.Tensor] = {}
    for name in weight_files(directory, files, algo):
        out.update(load_verified_safetensors(directory / name, files[name], algo, name, into))
    return out
