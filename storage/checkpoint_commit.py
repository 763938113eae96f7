"""The checkpoint commit format: ``COMMIT.json`` and ``LATEST`` documents, and the checks on them.

What it is: ``CheckpointRef`` (a committed version as COMMIT.json describes it), the parsers that refuse
a malformed COMMIT.json or LATEST with a named error, the digest check of one file against its entry,
the names a checkpoint directory reserves (LoRA adapter files, the cache's verified marker), and two
rules every reader applies before it trusts a file:

* ``check_needed_files``: every file the checkpoint needs is in COMMIT.json, so verifying COMMIT.json's
  files verifies everything a loader will open. A sharded ``model.safetensors.index.json`` names its
  shards in ``weight_map``; each must be a plain relative name listed in COMMIT.json (an absolute or
  ``../`` shard would be loaded from outside, unverified). An adapter's config needs its weights file.
* ``inside``: a local file is read only if its real path (symlinks resolved) lies inside the trial
  root (or the cache directory), so a symlink cannot make a verified checkpoint serve foreign bytes.
COMMIT.json is ``{format, version, step, hash, files: {name: {size, <hash>}}, meta, created_at}``;
``hash`` names the digest algorithm (format 1 predates it: sha256).
What it is not: reading or writing storage (``storage.checkpoints`` publishes and resolves,
``storage.checkpoint_fetch`` verifies and downloads, ``storage.checkpoint_acks`` acknowledges and
collects).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage import keys
from storage.errors import CheckpointIntegrityError
from storage.fs import TMP_MARKER
from storage.transfer import HASH_ALGOS, FileDigest

ADAPTER_CONFIG_NAME = "adapter_config.json"  # a version holding this file is a LoRA adapter (peft's format)
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"  # the adapter's tensors
SHARD_INDEX_NAME = "model.safetensors.index.json"  # a sharded model: weight_map names the shard files
COMMIT_FORMAT = 2  # 1: sha256 only, no "hash" field; 2: "hash" names the algorithm
VERIFIED_MARKER = ".rollflow-verified.json"
COMMIT_RE = re.compile(r"^checkpoints/v(\d{6,})/COMMIT\.json$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class CheckpointRef:
    """A committed checkpoint: where it is and what COMMIT.json says it holds."""

    version: int
    step: int | None
    uri: str  # checkpoint dir URI (absolute path on posix), no credentials
    files: dict[str, dict[str, Any]]  # relative name -> {"size": int, <hash_algo>: hex}
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)
    hash_algo: str = "sha256"

    @property
    def is_adapter(self) -> bool:
        """A LoRA adapter (adapter_config.json + adapter_model.safetensors), not a full model directory."""
        return ADAPTER_CONFIG_NAME in self.files


def parse_commit(raw: bytes, version: int) -> dict[str, Any]:
    """Validate COMMIT.json; CheckpointIntegrityError naming COMMIT.json if it is malformed."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, "JSON nested too deeply") from None
    except ValueError as e:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != version or not isinstance(doc.get("files"), dict):
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"malformed for version {version}")
    algo = commit_algo(doc)
    if algo not in HASH_ALGOS:
        raise CheckpointIntegrityError(keys.CHECKPOINT_COMMIT_NAME, f"unknown hash algorithm {algo!r}")
    for name, info in doc["files"].items():
        ok = (
            isinstance(info, dict)
            and isinstance(info.get("size"), int)
            and isinstance(info.get(algo), str)
            and _HEX64_RE.match(info[algo])
        )
        parts = name.split("/")
        if not ok or any(p in ("", ".", "..") for p in parts):
            raise CheckpointIntegrityError(name, "bad entry in COMMIT.json")
    return doc


def parse_latest(raw: bytes) -> int:
    """The version in a LATEST document `{"version": N, "path": ...}`; ValueError saying what is wrong.

    N must be a JSON integer >= 0: `-1`, `Infinity`, `1e9` (a float), `true` and junk are refused.
    """
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as e:  # also bad UTF-8
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise ValueError('not an object with a "version"')
    v = doc["version"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"version {v!r} is not an integer >= 0")
    return v


def commit_algo(doc: Mapping[str, Any]) -> str:
    """The digest algorithm of a COMMIT.json document (format 1 predates the field: sha256)."""
    return str(doc.get("hash", "sha256"))


def local_files(local_dir: Path) -> list[str]:
    """Relative '/'-separated names of the regular files under `local_dir`, skipping temp files."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(local_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for n in filenames:
            if TMP_MARKER in n or n == VERIFIED_MARKER:
                continue
            out.append(Path(dirpath, n).relative_to(local_dir).as_posix())
    return sorted(out)


def check_needed_files(names: Collection[str], index: bytes | None) -> None:
    """CheckpointIntegrityError unless every file the checkpoint needs is among ``names`` (COMMIT.json's).

    ``index``: the bytes of ``model.safetensors.index.json`` when ``names`` holds it. Its ``weight_map``
    values must be plain relative names (no absolute path, no ``..``) listed in ``names``; the error names
    the index and the entry, never what is (or is not) at a path outside the checkpoint.
    """
    if ADAPTER_CONFIG_NAME in names and ADAPTER_WEIGHTS_NAME not in names:
        raise CheckpointIntegrityError(
            ADAPTER_WEIGHTS_NAME, f"{ADAPTER_CONFIG_NAME} needs it; not in COMMIT.json"
        )
    if index is None:
        return
    try:
        shards = set(json.loads(index)["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CheckpointIntegrityError(SHARD_INDEX_NAME, f"unreadable: {type(e).__name__}") from None
    for shard in sorted(shards, key=str):
        if not isinstance(shard, str) or not _plain_name(shard):
            raise CheckpointIntegrityError(
                SHARD_INDEX_NAME, f"weight_map names {str(shard)[:80]!r}, not a file inside the checkpoint"
            )
        if shard not in names:
            raise CheckpointIntegrityError(
                SHARD_INDEX_NAME, f"weight_map names {shard!r}, not in COMMIT.json"
            )


def _plain_name(name: str) -> bool:
    parts = name.split("/")
    return (
        not name.startswith("/")
        and "\\" not in name
        and "\x00" not in name
        and all(p not in ("", ".", "..") for p in parts)
    )


def inside(path: Path, root: Path) -> bool:
    """True when ``path``'s real path (every symlink resolved) is ``root``'s real path or lies under it."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def check_inside(name: str, path: Path, root: Path, what: str = "the trial root") -> None:
    """CheckpointIntegrityError naming ``name`` if ``path`` resolves outside ``root`` (a symlink out)."""
    if not inside(path, root):
        raise CheckpointIntegrityError(
            name, f"is a symlink out of {what}; refused (copy the file in instead)"
        )


def check_digest(name: str, got: FileDigest, expect: Mapping[str, Any], algo: str) -> None:
    if got.size != expect["size"]:
        raise CheckpointIntegrityError(name, f"size {got.size} != {expect['size']} in COMMIT.json")
    if got.algo != algo or got.digest != expect[algo]:
        raise CheckpointIntegrityError(
            name, f"{algo} {got.digest[:16]}... != {expect[algo][:16]}... in COMMIT.json"
        )
