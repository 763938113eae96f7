"""Is a checkpoint directory loadable into the model a server serves? Checked from file headers only.

What it is: ``check_loadable(new_dir, served_dir)`` reads ``config.json`` and the header of every
``*.safetensors`` file of both directories (a few KB each, no tensor data) and raises
``WeightUpdateError`` naming the first problem:

- a safetensors file whose header is unreadable, or whose tensors do not cover the file exactly
  (``8 + header_len + max(data_offsets end) != file size``: truncated or padded);
- another ``architectures`` / ``model_type`` than the served model's;
- a tensor missing, extra, or with another shape than the served one (dtypes may differ: the engine
  converts).

Engines whose in-place reload is not atomic call it before loading (vLLM's ``reload_weights`` copies
tensor by tensor into the live model, so a mismatch found half-way would leave it half-loaded, and a
shape mismatch kills its engine core). It complements, not replaces, the blake3 check against
COMMIT.json that the watcher runs on every checkpoint of the store.

What it is not: no digest check, no tensor data read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from rollflow.api.errors import WeightUpdateError

_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{tensor name: (dtype, shape)}`` of one file; raises ``WeightUpdateError`` if it is damaged."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightUpdateError(f"{path}: {size} bytes, not a safetensors file (truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise WeightUpdateError(f"{path}: header of {n} bytes does not fit in {size} bytes (truncated?)")
        try:
            header: dict[str, Any] = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise WeightUpdateError(f"{path}: unreadable safetensors header: {e}") from None
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            out[name] = (str(meta["dtype"]), tuple(int(x) for x in meta["shape"]))
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise WeightUpdateError(f"{path}: malformed entry for tensor {name!r}") from None
    if 8 + n + end != size:
        raise WeightUpdateError(
            f"{path}: the tensors need {8 + n + end} bytes but the file has {size} (truncated or damaged); "
            "re-publish the checkpoint"
        )
    return out


def tensor_index(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"{model_dir}: no *.safetensors file (rollflow loads safetensors only)")
    index: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in files:
        index.update(safetensors_header(f))
    return index


def _arch(model_dir: Path) -> tuple[Any, Any]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightUpdateError(f"{model_dir}: no readable config.json ({e})") from None
    return cfg.get("architectures"), cfg.get("model_type")


def check_loadable(new_dir: str | Path, served_dir: str | Path) -> None:
    """Raise ``WeightUpdateError`` unless ``new_dir`` holds intact weights of ``served_dir``'s architecture."""
    new, ref = Path(new_dir), Path(served_dir)
    if not new.is_dir():
        raise WeightUpdateError(f"{new}: not a directory")
    if _arch(new) != _arch(ref):
        raise WeightUpdateError(
            f"{new}: architecture {_arch(new)} differs from the served model's {_arch(ref)} ({ref})"
        )
    have, want = tensor_index(new), tensor_index(ref)
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or extra:
        raise WeightUpdateError(
            f"{new}: tensors differ from the served model's: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    for name, (_, shape) in want.items():
        if have[name][1] != shape:
            raise WeightUpdateError(
                f"{new}: tensor {name} has shape {list(have[name][1])}, the served model's has {list(shape)} "
                "(another architecture?)"
            )
