"""Load and check a new checkpoint for ``/update_weights_from_disk``, then swap it into the live model.

What it is: ``load_checked_weights`` reads a Hugging Face model directory (``config.json`` + safetensors,
single file or sharded with ``model.safetensors.index.json``) into memory the server owns and checks it
against the served model: same architecture fields in config.json, every parameter present with the right
shape, floating dtype, all values finite. Only when every check passes does ``swap_weights_in_place`` point
the existing parameters at the new tensors (``param.data = t``), so the model object, its buffers and the
KV cache layout stay the same, and a failed check leaves the old weights serving untouched.

Cost (``python -m bench.inference``, ``server_load_vs_raw``): one read of the file through safetensors'
memory map, one copy into the served dtype (private memory: the served weights never depend on the
file again, so GC deleting it, or anything changing it after verification, cannot reach them) and one
``aminmax`` pass per tensor for the finiteness check (NaN and inf propagate to the min or max; no
full-size boolean mask is allocated). That is about what ``safetensors.load_file`` +
``load_state_dict`` costs, and the swap itself copies nothing.

Every file it opens (config.json, the index, each shard, ``model.safetensors``) is checked after
``os.path.realpath``: it must lie inside the allowed directories (the server's weights roots, or the
checkpoint directory itself when the server has none), so neither an index whose ``weight_map`` names
``/elsewhere/x.safetensors`` or ``../x.safetensors`` nor a symlink can make the server serve tensors
from outside. The check runs before anything is opened or tested for existence, and the refusal names
only the file inside the checkpoint, so the error never tells whether an outside path exists.

Verified in the same read: with ``commit`` (COMMIT.json's ``{"hash", "files"}``, which the checkpoint
watcher sends with the update), config.json, the index and every weight file must be listed there, and
each weight file is read once, straight into the new tensors, while a second thread hashes the same
bytes (``rollflow.models.verified_weights``); a file whose size or digest differs refuses the update
before any check or swap, so the served weights never change. The watcher then checks only the
directory's layout (listing, links, sizes) and leaves the weights' digests to this read. Without
``commit`` (a hand-made directory) nothing is checked against a digest.

What it is not: no pickle
(``pytorch_model.bin`` is refused), no dtype policy beyond casting to the served dtype, no remote paths.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rollflow.models.verified_weights import load_verified_safetensors, weight_files
from storage.errors import CheckpointIntegrityError
from storage.read_hashed import read_verified

logger = logging.getLogger(__name__)

# config.json fields that change the computation; a new checkpoint must match the served one on all of them.
STRUCTURAL_KEYS = (
    "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "max_position_embeddings",
    "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps", "hidden_act", "attention_bias", "mlp_bias",
    "sliding_window", "use_sliding_window", "layer_types",
)  # fmt: skip


class WeightLoadError(Exception):
    """The checkpoint cannot be served; the message says which file or field and why."""


def allowed_dirs(model_dir: Path, roots: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The real paths a checkpoint's files may resolve into: the weights roots, else the directory itself."""
    return tuple(os.path.realpath(r) for r in (roots or (str(model_dir),)))


def checked_file(model_dir: Path, name: str, allowed: tuple[str, ...]) -> Path:
    """``model_dir / name`` if it stays inside ``allowed`` after resolution (``..``, absolute names and
    symlinks included); else ``WeightLoadError`` naming only ``name``, before the target is looked at."""
    if not name or os.path.isabs(name) or ".." in Path(name).parts or "\x00" in name:
        raise WeightLoadError(f"{name!r} is not a file name inside the checkpoint directory; refused")
    path = model_dir / name
    real = os.path.realpath(path)
    if not any(real == a or real.startswith(a.rstrip(os.sep) + os.sep) for a in allowed):
        raise WeightLoadError(
            f"{name} in the checkpoint resolves outside the directories this server loads from "
            "(a symlink out of the checkpoint); refused"
        )
    return path


def read_config(model_dir: Path, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    path = model_dir / "config.json" if allowed is None else checked_file(model_dir, "config.json", allowed)
    if not path.is_file():
        raise WeightLoadError(f"no config.json in {model_dir}")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightLoadError(f"config.json in {model_dir} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise WeightLoadError(f"config.json in {model_dir} is not a JSON object")
    return cfg


def check_config_matches(served: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise if any structural field differs, e.g. ``hidden_size: served 128, checkpoint 256``."""
    diffs = [
        f"{k}: served {served.get(k)!r}, checkpoint {new.get(k)!r}"
        for k in STRUCTURAL_KEYS
        if served.get(k) != new.get(k)
    ]
    if diffs:
        raise WeightLoadError("config.json does not match the served model: " + "; ".join(diffs))


def _safetensors_files(model_dir: Path, allowed: tuple[str, ...]) -> list[Path]:
    index = checked_file(model_dir, "model.safetensors.index.json", allowed)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise WeightLoadError(f"{index.name} is unreadable: {type(e).__name__}: {e}") from None
        if not shards or not all(isinstance(f, str) for f in shards):
            raise WeightLoadError(f"{index.name}: weight_map must map tensor names to shard file names")
        files = [checked_file(model_dir, f, allowed) for f in shards]  # before any existence test
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WeightLoadError(f"{index.name} names missing shard(s) {missing}")
        return files
    single = checked_file(model_dir, "model.safetensors", allowed)
    if single.is_file():
        return [single]
    if any(model_dir.glob("*.bin")):
        raise WeightLoadError(
            f"{model_dir} has only .bin weights; the CPU server loads safetensors only (no pickle)"
        )
    raise WeightLoadError(f"no model.safetensors (or sharded index) in {model_dir}")


def load_checked_weights(
    model: torch.nn.Module,
    served_config: dict[str, Any],
    model_path: str,
    load_format: str | None = None,
    *,
    roots: tuple[str, ...] = (),
    commit: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Read and verify every tensor of ``model_path``; returns ``{param_name: tensor}`` ready to swap.

    ``roots``: the server's weights roots; every file must resolve inside one of them (inside
    ``model_path`` itself when empty). ``commit``: COMMIT.json's ``{"hash", "files"}``; each file read is
    checked against it in the same read. Raises ``WeightLoadError`` naming the first problem. Copies the whole checkpoint into private memory
    (about one model's worth, in the served dtype), which is what keeps the swap itself pointer moves.
    """
    if load_format not in (None, "auto", "safetensors"):
        raise WeightLoadError(f"load_format {load_format!r} is not supported (use auto or safetensors)")
    model_dir = Path(model_path)
    if not model_dir.is_dir():
        raise WeightLoadError(f"model_path {model_path!r} is not a directory")
    allowed = allowed_dirs(model_dir, roots)
    if commit is not None:
        tensors = _read_committed(model_dir, served_config, allowed, commit)
    else:
        check_config_matches(served_config, read_config(model_dir, allowed))
        tensors = {}
        for f in _safetensors_files(model_dir, allowed):
            try:
                tensors.update(load_file(str(f), device="cpu"))
            except Exception as e:  # safetensors raises its own error types on truncated / corrupt files
                raise WeightLoadError(f"cannot read {f.name}: {e}") from e

    params = dict(model.named_parameters())  # tied weights appear once, under their first name
    state_names = set(model.state_dict().keys())
    out: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        t = tensors.get(name)
        if t is None:
            raise WeightLoadError(f"checkpoint has no tensor {name!r}")
        if tuple(t.shape) != tuple(p.shape):
            raise WeightLoadError(
                f"tensor {name!r} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}"
            )
        if not t.is_floating_point():
            raise WeightLoadError(f"tensor {name!r} has dtype {t.dtype}, expected a floating dtype")
        # off the file's memory map, in the served dtype (a verified read is private memory already)
        own = t if commit is not None and t.dtype == p.dtype else torch.empty(t.shape, dtype=p.dtype).copy_(t)
        if not _all_finite(own):
            raise WeightLoadError(f"tensor {name!r} has NaN or inf values")
        out[name] = own
    extra = sorted(set(tensors) - set(params) - state_names)
    if extra:
        raise WeightLoadError(f"checkpoint has tensors the model does not: {extra[:5]}")
    return out


def _read_committed(
    model_dir: Path, served_config: dict[str, Any], allowed: tuple[str, ...], commit: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """Every tensor of ``model_dir``, each file it reads (config, index, weights) checked against
    ``commit`` as it is read: one read per file; ``WeightLoadError`` naming the first that differs."""
    algo, files = commit["hash"], commit["files"]
    try:
        if "config.json" not in files:
            raise CheckpointIntegrityError("config.json", "not in COMMIT.json")
        cfg_path = checked_file(model_dir, "config.json", allowed)
        try:
            cfg = json.loads(read_verified(cfg_path, files["config.json"], algo, "config.json"))
        except (ValueError, RecursionError) as e:
            raise WeightLoadError(f"config.json in {model_dir} is not valid JSON: {e}") from e
        if not isinstance(cfg, dict):
            raise WeightLoadError(f"config.json in {model_dir} is not a JSON object")
        check_config_matches(served_config, cfg)
        for name in files:  # before any is opened: nothing read through a link out of the allowed dirs
            checked_file(model_dir, name, allowed)
        tensors: dict[str, torch.Tensor] = {}
        for name in weight_files(model_dir, files, algo):
            tensors.update(load_verified_safetensors(model_dir / name, files[name], algo, name))
        return tensors
    except CheckpointIntegrityError as e:
        raise WeightLoadError(f"{e} (verified as it was read; nothing loaded)") from e
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # an index without a usable weight_map
        raise WeightLoadError(f"cannot read the checkpoint's index: {type(e).__name__}: {e}") from None


def _all_finite(t: torch.Tensor) -> bool:
    """True if no element is NaN or +-inf: one pass, since both propagate to ``aminmax``."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


@torch.no_grad()
def swap_weights_in_place(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Point every live parameter at its checked tensor (cast to the served dtype); the caller holds the engine.

    The ``nn.Parameter`` objects, the module tree and the KV cache stay; only the storage behind each
    parameter changes (``param.data = tensor``), so the swap costs no copy and cannot fail half-way.
    """
    for name, p in model.named_parameters():
        t = tensors[name]
        p.data = t if t.dtype == p.dtype else t.to(p.dtype)
