"""Delta checkpoints, measured: how much of a published version differs from the version before it.

What it is: the measurement behind issue 20, section 5, run by ``python -m bench.storage --delta`` (or
``--delta-only``). For each publish dtype (float32, bfloat16) and each learning rate (the configured
``train.lr`` of configs/tiny_cpu.yaml and one 10x lower) it trains the tiny model of that config with
the real ``Trainer`` for ``steps`` steps on synthetic committed shards (no servers), publishing every
version (``checkpoint_every: 1``). It then reads the published safetensors files back, exactly as a
reader would fetch them, and for each pair of consecutive versions (v, v+1) computes, over the tensors'
bytes (n elements of e bytes, F = the weight files' bytes, c = elements whose bytes changed):

    changed_fraction       c / n
    changed_byte_fraction  bytes that differ / (n e)
    sparse_ratio           c (e + 4) / F              a 4-byte index + the new value per changed element
    bitmask_ratio          (n / 8 + c e) / F          a changed-bit per element + the new values
    xor_zlib_ratio         zlib(v XOR v+1) / F         level 1, the better of raw and byte-plane order
    best_ratio             min of the three encodings: the bytes a delta version would carry

What "bfloat16" means here: the trainer keeps float32 master weights (``policy_build`` loads float32;
``train.dtype: bfloat16`` is autocast) and ``model.dtype: bfloat16`` makes the publisher round them to
bfloat16 (``publish.write_hf_dir``). So the bf16 runs set both and measure the bf16 files published.

Data: groups of ``group_size`` rows of random tokens from the tiny tokenizer's vocabulary, random 0/1
rewards, and behaviour logprobs from the starting model (so the behaviour importance weight starts at
1, as on-policy rollouts would). Random data gives noisy gradients; the smoke demo's own versions
(docs/storage.md) are the cross-check.

What it is not: a delta publisher (nothing in ``storage/`` writes deltas) or a timing benchmark.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.yaml"
DTYPES = ("float32", "bfloat16")
ENCODINGS = ("sparse_ratio", "bitmask_ratio", "xor_zlib_ratio")
_ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4}


@dataclass(frozen=True)
class DeltaSettings:
    """One measurement's size. ``warm_start_steps=None``: the config's own warm start (the demo's model)."""

    steps: int = 30
    groups: int = 16  # per step = tiny_cpu.yaml's train.batch_size
    group_size: int = 8
    prompt_len: int = 18
    completion_len: int = 8
    warm_start_steps: int | None = None
    lr_divisors: tuple[float, ...] = (1.0, 10.0)
    seed: int = 1


# --- reading published versions --------------------------------------------------------------------------


def weight_bytes(ckpt_dir: Path) -> tuple[list[tuple[str, int, np.ndarray]], int]:
    """The tensors of a published version as ``(name, element bytes, raw bytes [n e])``, in file order,
    and the weight files' total size F. Only ``*.safetensors`` files count (config files are tiny)."""
    tensors: list[tuple[str, int, np.ndarray]] = []
    total = 0
    for path in sorted(ckpt_dir.glob("*.safetensors")):
        raw = np.fromfile(path, dtype=np.uint8)  # [file bytes]
        total += raw.size
        head_len = int.from_bytes(raw[:8].tobytes(), "little")
        header = json.loads(raw[8 : 8 + head_len].tobytes())
        body = raw[8 + head_len :]
        for name, info in sorted(header.items()):
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            tensors.append((f"{path.name}:{name}", _ELEMENT_BYTES[info["dtype"]], body[start:end]))
    if not tensors:
        raise FileNotFoundError(f"no safetensors weights in {ckpt_dir}: not a full checkpoint directory")
    return tensors, total


def pair_figures(
    prev: list[tuple[str, int, np.ndarray]], cur: list[tuple[str, int, np.ndarray]], file_bytes: int
) -> dict[str, float]:
    """The figures of one version pair (see the module docstring); both lists in the same layout."""
    if [(n, e, b.size) for n, e, b in prev] != [(n, e, b.size) for n, e, b in cur]:
        raise ValueError("the two versions have different tensors, dtypes or shapes: no delta between them")
    n_elems = changed = changed_bytes = data_bytes = 0
    raw_z, plane_z = zlib.compressobj(1), zlib.compressobj(1)
    raw_len = plane_len = 0
    for (_, elem, a), (_, _, b) in zip(prev, cur, strict=True):
        x = np.bitwise_xor(a, b)  # [n e] uint8
        per_elem = x.reshape(-1, elem)  # [n, e]
        n_elems += per_elem.shape[0]
        changed += int(np.count_nonzero(per_elem.any(axis=1)))
        changed_bytes += int(np.count_nonzero(x))
        data_bytes += x.size
        raw_len += len(raw_z.compress(x.tobytes()))
        plane_len += len(plane_z.compress(np.ascontiguousarray(per_elem.T).tobytes()))  # [e, n] byte planes
    raw_len += len(raw_z.flush())
    plane_len += len(plane_z.flush())
    elem_avg = data_bytes / n_elems
    out = {
        "changed_fraction": changed / n_elems,
        "changed_byte_fraction": changed_bytes / data_bytes,
        "sparse_ratio": changed * (elem_avg + 4) / file_bytes,
        "bitmask_ratio": (-(-n_elems // 8) + changed * elem_avg) / file_bytes,
        "xor_zlib_ratio": min(raw_len, plane_len) / file_bytes,
    }
    out["best_ratio"] = min(out[k] for k in ENCODINGS)
    return out


def version_pairs(ckpt_dirs: list[Path]) -> list[dict[str, float]]:
    """``pair_figures`` of each consecutive pair of the given version directories (oldest first)."""
    out = []
    prev, _ = weight_bytes(ckpt_dirs[0])
    for d in ckpt_dirs[1:]:
        cur, size = weight_bytes(d)
        out.append(pair_figures(prev, cur, size))
        prev = cur
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --- training the tiny model and publishing every version ------------------------------------------------


def _write_shards(storage: Any, model_dir: Path, s: DeltaSettings, n_groups: int) -> None:
    """Committed shards of random-token groups, with the starting model's logprobs as behaviour logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollflow.models.tokenizer import build_tokenizer
    from storage.schema import TrajectoryGroup, TrajectoryRow
    from storage.shard_writer import ShardWriter

    vocab = len(build_tokenizer())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(s.seed)
    writer = ShardWriter(storage, "delta", flush_rows=s.groups * s.group_size, flush_seconds=3600.0)
    for g in range(n_groups):
        prompt = [rng.randrange(4, vocab) for _ in range(s.prompt_len)]
        completions = [
            [rng.randrange(4, vocab) for _ in range(s.completion_len)] for _ in range(s.group_size)
        ]
        ids = torch.tensor([prompt + c for c in completions])  # [G, T]
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()  # [G, T-1, V]
        lp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)  # [G, T-1]
        rows = [
            TrajectoryRow.build(
                traj_id=f"g{g}-{i}",
                group_id=f"g{g}",
                prompt_id=f"p{g}",
                input_ids=ids[i].tolist(),
                loss_mask=[0] * s.prompt_len + [1] * s.completion_len,
                logprobs=[0.0] * s.prompt_len + lp[i, s.prompt_len - 1 :].tolist(),
                versions=[-1] * s.prompt_len + [0] * s.completion_len,
                reward=float(rng.random() < 0.5),
                finish_reason="stop",
            )
            for i in range(s.group_size)
        ]
        writer.add(TrajectoryGroup(f"g{g}", f"p{g}", rows))
    writer.close()


def _config(workdir: Path, trial: str, model_dir: Path, dtype: str, lr: float, s: DeltaSettings) -> Any:
    from rollflow.configuration.loader import load_config

    return load_config(
        CONFIG,
        data={
            "trial": trial,
            "storage": {"root": str(workdir / "store"), "keep_checkpoints": s.steps + 1},
            "model": {"path": str(model_dir), "bootstrap_tiny": False, "dtype": dtype},
            "rollout": {"max_staleness": 10_000, "group_size": s.group_size},
            "train": {
                "steps": s.steps,
                "batch_size": s.groups,
                "lr": lr,
                "dtype": dtype,
                "threads": 1,
                "checkpoint_every": 1,
                "resume_every": s.steps + 1,
            },
        },
    )


def publish_versions(workdir: Path, model_dir: Path, dtype: str, lr: float, s: DeltaSettings) -> list[Path]:
    """Train ``s.steps`` steps publishing every version; the version directories v0..v{steps}."""
    from rollflow.training.trainer import Trainer
    from rollflow.trial.store import open_trial_storage
    from storage import keys

    trial = f"{dtype}-lr{lr:g}"
    cfg = _config(workdir, trial, model_dir, dtype, lr, s)
    storage = open_trial_storage(cfg)
    _write_shards(storage, model_dir, s, s.steps * s.groups)
    summary = Trainer(cfg, storage).run()
    if summary.final_version != s.steps:
        raise RuntimeError(f"{trial}: the trainer stopped at v{summary.final_version}, not v{s.steps}")
    return [storage.local_path(keys.checkpoint_dir(v)) for v in range(s.steps + 1)]


def build_model(workdir: Path, s: DeltaSettings) -> Path:
    """configs/tiny_cpu.yaml's tiny model (its warm start unless ``s.warm_start_steps`` says otherwise)."""
    from rollflow.configuration.loader import load_config
    from rollflow.models.bootstrap import bootstrap_tiny_model

    cfg = load_config(CONFIG)
    tiny = cfg.model.tiny
    if s.warm_start_steps is not None:
        tiny = dataclasses.replace(tiny, warm_start_steps=s.warm_start_steps)
    return bootstrap_tiny_model(
        tiny, workdir / "model", seed=cfg.seed, task=cfg.dataset.synthetic.task, threads=1
    )


def measure(workdir: Path, s: DeltaSettings, model_dir: Path | None = None) -> tuple[dict[str, float], dict]:
    """Figures (``key -> value``, medians over the version pairs) and details (every pair, spreads)."""
    from rollflow.configuration.loader import load_config

    base_lr = load_config(CONFIG).train.lr
    model_dir = model_dir or build_model(workdir, s)
    figures: dict[str, float] = {}
    details: dict[str, Any] = {"settings": dataclasses.asdict(s), "base_lr": base_lr, "runs": {}}
    for divisor in s.lr_divisors:
        lr = base_lr / divisor
        suffix = "" if divisor == 1.0 else f"_lr_div{divisor:g}"
        for dtype in DTYPES:
            short = "fp32" if dtype == "float32" else "bf16"
            pairs = version_pairs(publish_versions(workdir, model_dir, dtype, lr, s))
            stats = {k: spread([p[k] for p in pairs]) for k in pairs[0]}
            details["runs"][f"{short}{suffix}"] = {"lr": lr, "spread": stats, "pairs": pairs}
            figures[f"delta_changed_fraction_{short}{suffix}"] = stats["changed_fraction"]["median"]
            figures[f"storage_bytes_per_version_ratio_{short}{suffix}"] = stats["best_ratio"]["median"]
    # the headline: what a delta of the configured run would carry in the dtype a large model publishes
    figures["storage_bytes_per_version_ratio"] = figures["storage_bytes_per_version_ratio_bf16"]
    return figures, details
