"""Resume points: everything a killed trainer needs to continue exactly where it committed.

What it is: writing, finding, verifying, loading and garbage-collecting resume points in storage.

    trainer/state-{step:08d}/model.safetensors       full (unsharded) model state, float32 master weights
    trainer/state-{step:08d}/optimizer.safetensors   optimizer tensors, flattened: "state/{param fqn}/{name}"
    trainer/state-{step:08d}.json                    written LAST: version, reader cursor, scheduler,
                                                     per-rank RNG, counters, optimizer param groups (JSON),
                                                     size + sha256 of each blob

The JSON is the commit point (delta-style): a resume point exists iff its JSON does, and the JSON is only
written after every blob it names is in place, so a crash mid-write leaves at worst orphan blobs (removed
by the next GC). No pickle: tensors go to safetensors, everything else to JSON. ``step`` is the trainer
version (the number of training steps applied).

What it is not: the decision of when to write one (``trainer.py``) or how state dicts are gathered from
sharded models (``distributed.py``).
"""

from __future__ import annotations

import base64
import logging
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rollflow.api.errors import TrainerError
from rollflow.api.stores import ObjectStore
from storage import keys

logger = logging.getLogger(__name__)

RESUME_FORMAT = 1
MODEL_BLOB = "model.safetensors"
OPTIM_BLOB = "optimizer.safetensors"


@dataclass
class ResumePoint:
    """The JSON half of a resume point (the blobs are named in ``files``)."""

    step: int
    version: int
    cursor: dict[str, Any]
    scheduler: dict[str, Any]
    optimizer_meta: dict[str, Any]
    rng: list[dict[str, Any]]  # one entry per rank
    counters: dict[str, int] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # blob name -> {size, sha256}
    world_size: int = 1
    created_at: float = field(default_factory=time.time)
    format: int = RESUME_FORMAT

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ResumePoint:
        if obj.get("format") != RESUME_FORMAT:
            raise TrainerError(f"resume point format {obj.get('format')!r} is not {RESUME_FORMAT}")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in obj.items() if k in known})


# --- optimizer state <-> safetensors + JSON ----------------------------------------------------------------


def flatten_optimizer_state(osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``{"state": {fqn: {name: value}}, "param_groups": [...]}`` -> (tensors, JSON-able meta).

    Tensor entries become ``"state/{fqn}/{name}"``; non-tensor entries go to ``meta["scalars"]``.
    """
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for fqn, entries in osd["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"state/{fqn}/{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(fqn, {})[name] = value
    groups = [_jsonable(g) for g in osd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def unflatten_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of ``flatten_optimizer_state``."""
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, rest = key.split("/", 1)
        fqn, name = rest.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = value
    for fqn, entries in meta.get("scalars", {}).items():
        state.setdefault(fqn, {}).update(entries)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if torch.is_tensor(obj):
        return obj.item() if obj.numel() == 1 else obj.tolist()
    if isinstance(obj, (np.generic,)):
        return obj.item()
    return obj


def scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """JSON-able LR scheduler state (the lambdas are code, rebuilt from config)."""
    sd = dict(scheduler.state_dict())
    sd.pop("lr_lambdas", None)
    return _jsonable(sd)


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LRScheduler, state: dict[str, Any]) -> None:
    sd = dict(state)
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        sd["lr_lambdas"] = [None] * len(scheduler.lr_lambdas)
    scheduler.load_state_dict(sd)


# --- RNG ---------------------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (torch CPU / CUDA, Python, NumPy) as JSON."""
    py = random.getstate()
    np_state = np.random.get_state()
    out: dict[str, Any] = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(state: dict[str, Any]) -> None:
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys_, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys_, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        states = [
            torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy()) for s in state["cuda"]
        ]
        torch.cuda.set_rng_state_all(states[: torch.cuda.device_count()])


# --- storage -----------------------------------------------------------------------------------------------


def write_resume_point(
    storage: ObjectStore,
    point: ResumePoint,
    model_sd: dict[str, torch.Tensor],
    optim_sd: dict[str, Any],
) -> str:
    """Upload the blobs, then commit the JSON; returns the JSON key. Rank 0 only."""
    tensors, meta = flatten_optimizer_state(optim_sd)
    point.optimizer_meta = meta
    blob_dir = keys.trainer_state_dir(point.step)
    files: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rollflow-resume-") as tmp:
        for name, sd in ((MODEL_BLOB, model_sd), (OPTIM_BLOB, tensors)):
            local = Path(tmp) / name
            save_file({k: v.contiguous() for k, v in sd.items()}, str(local), metadata={"format": "pt"})
            digest = storage.put_file(local, f"{blob_dir}/{name}")
            files[name] = {"size": digest.size, "sha256": digest.sha256}
    point.files = files
    key = keys.trainer_state_key(point.step)
    storage.put_json(key, asdict(point))
    logger.debug("resume point committed: %s (version %d)", key, point.version)
    return key


def list_resume_steps(storage: ObjectStore) -> list[int]:
    """Steps of committed resume points (their JSON exists), ascending."""
    found = (keys.parse_trainer_state_key(k) for k in storage.list(keys.TRAINER_DIR))
    return sorted(s for s in found if s is not None)


def read_resume_point(storage: ObjectStore, step: int) -> ResumePoint:
    """The resume point of ``step``. ``TrainerError`` naming the key when its JSON does not parse or has
    the wrong shape (junk, nested too deeply, a list, a missing field); FileNotFoundError if absent."""
    key = keys.trainer_state_key(step)
    try:
        return ResumePoint.from_json(storage.get_json(key))
    except TrainerError:
        raise
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {str(e)[:200]}"
        raise TrainerError(f"resume point {key} is unreadable ({why})") from None


def _blobs_present(storage: ObjectStore, point: ResumePoint) -> bool:
    blob_dir = keys.trainer_state_dir(point.step)
    for name, info in point.files.items():
        try:
            if storage.size(f"{blob_dir}/{name}") != int(info["size"]):
                return False
        except FileNotFoundError:
            return False
    return bool(point.files)


def find_latest_resume_point(storage: ObjectStore) -> ResumePoint | None:
    """The newest resume point whose JSON parses and whose blobs exist with the recorded sizes."""
    for step in reversed(list_resume_steps(storage)):
        try:
            point = read_resume_point(storage, step)
        except (ValueError, TrainerError, FileNotFoundError) as e:
            logger.warning("skipping unreadable resume point %d: %s", step, e)
            continue
        if not _blobs_present(storage, point):
            logger.warning("skipping resume point %d: a blob is missing or truncated", step)
            continue
        return point
    return None


def load_resume_blobs(
    storage: ObjectStore, point: ResumePoint
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state dict, optimizer state dict), verified against the recorded sha256."""
    blob_dir = keys.trainer_state_dir(point.step)
    loaded: dict[str, dict[str, torch.Tensor]] = {}
    with tempfile.TemporaryDirectory(prefix="rollflow-resume-") as tmp:
        for name in (MODEL_BLOB, OPTIM_BLOB):
            info = point.files[name]
            local = Path(tmp) / name
            digest = storage.get_file(f"{blob_dir}/{name}", local, size=int(info["size"]))
            if digest.sha256 != info["sha256"] or digest.size != int(info["size"]):
                raise TrainerError(
                    f"resume point {point.step}: {name} has sha256 {digest.sha256[:12]}.. size {digest.size}, "
                    f"expected {str(info['sha256'])[:12]}.. size {info['size']}"
                )
            loaded[name] = load_file(str(local))
    return loaded[MODEL_BLOB], unflatten_optimizer_state(loaded[OPTIM_BLOB], point.optimizer_meta)


def gc_resume_points(storage: ObjectStore, keep: int = 2) -> None:
    """Delete all but the newest ``keep`` resume points (JSON first, so no JSON ever names missing blobs),
    and blob directories that no JSON names (left by a crash mid-write)."""
    steps = list_resume_steps(storage)
    live = set(steps[-keep:]) if keep > 0 else set()
    for step in steps:
        if step not in live:
            storage.delete(keys.trainer_state_key(step))
            storage.delete(keys.trainer_state_dir(step), recursive=True)
    for d in storage.list_dirs(keys.TRAINER_DIR):
        step = keys.parse_trainer_state_dir(d)
        if step is not None and step not in live:
            if step > max(steps, default=-1):
                continue  # a resume point being written right now (its JSON is not there yet)
            storage.delete(d, recursive=True)


def drop_replayed_logs(storage: ObjectStore, version: int) -> None:
    """Delete the consumed-groups logs of steps after ``version`` (``trainer/consumed/``): a resume at
    ``version`` replays those steps, and each writes its log again."""
    for k in storage.list(keys.CONSUMED_DIR):
        step = keys.parse_consumed_key(k)
        if step is not None and step > version:
            storage.delete(k)
