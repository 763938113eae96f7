"""Load a LoRA adapter for ``/update_weights_from_disk``: check it against the base, merge it into a copy.

What it is: ``is_adapter_dir`` (a directory with ``adapter_config.json``, peft's format) and
``load_checked_adapter``, which reads ``adapter_model.safetensors`` + ``adapter_config.json``, checks
them against the model the server started from (its *base*), and returns the full parameter dict that
``weights.swap_weights_in_place`` serves, with every adapted linear layer merged:

    W' = W_base + s * B @ A,   A: [r, in], B: [out, r],   s = alpha / r   (alpha / sqrt(r) with rslora)

computed in float32 and cast to the served dtype. Layers without an adapter are served from the base
tensors themselves (no copy), so an adapter costs the memory of the layers it adapts. Merging is always
against the base, never against the weights being served, so versions do not accumulate.

This is this engine's hot load: the merge runs while generation goes on, and the swap is the same
pointer swap, under the same pause and the same ``weight_version`` bookkeeping, as a full checkpoint's;
per-token versions stay exact. Engines with multi-LoRA kernels (vLLM ``/v1/load_lora_adapter``, SGLang
``/load_lora_adapter``) keep B and A apart instead; docs/lora.md says what they need.

Refused, each with a ``WeightLoadError`` naming the tensor, module or field, before anything changes
(the old weights keep serving): a config that is not LoRA or uses an option this merge does not
implement (DoRA, biases, fan_in_fan_out, modules_to_save, per-layer rank/alpha patterns, ...); a
target module the model lacks; a tensor for a module that is not a linear layer of the model; the
wrong rank (A and B disagree, or disagree with ``r`` in adapter_config.json, or ``r`` exceeds the
server's ``max_lora_rank``); shapes that do not fit the base layer; NaN or inf values, in the
adapter or in the merged weights; a ``lora_alpha`` that is not a finite number in ``(0, MAX_LORA_ALPHA]``
(NaN, inf and 1e308 would make every served logprob NaN); a ``target_modules`` that is not a list of
module names (peft also takes a regex string, which this server refuses: a pattern like ``(.|.)*Z``
backtracks for hours while holding the GIL); a file that resolves outside the checkpoint directory (or
the server's weights roots), checked as in ``weights.py``. Checksums are the watcher's: it verifies
every file against COMMIT.json before it asks for the load.

What it is not: a full-checkpoint loader (``weights.py``) or a multi-adapter server (one adapter at a
time, merged).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from infra.cpu_server.weights import WeightLoadError, _all_finite, allowed_dirs, checked_file
from storage.checkpoints import ADAPTER_CONFIG_NAME as ADAPTER_CONFIG
from storage.checkpoints import ADAPTER_WEIGHTS_NAME as ADAPTER_WEIGHTS

_PREFIX = "base_model.model."  # peft's saved names: base_model.model.<module>.lora_{A,B}.weight
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
# The largest lora_alpha served. The merge scales B @ A by alpha / r (alpha / sqrt(r) with rslora); peft's
# examples use 8..512, and 1e4 already turns an adapter of ordinary values into float32 overflow.
MAX_LORA_ALPHA = 1e4
MAX_TARGET_MODULES = 4096
# adapter_config.json options the merge above does not implement: refused when set (truthy).
UNSUPPORTED = (
    "use_dora", "lora_bias", "fan_in_fan_out", "modules_to_save", "rank_pattern", "alpha_pattern",
    "layer_replication", "trainable_token_indices", "target_parameters", "alora_invocation_tokens",
    "use_qalora", "use_bdlora",
)  # fmt: skip


def is_adapter_dir(model_path: str) -> bool:
    """True if ``model_path`` is a peft adapter directory (it holds adapter_config.json)."""
    return (Path(model_path) / ADAPTER_CONFIG).is_file()


def read_adapter_config(adapter_dir: Path, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """adapter_config.json, checked to describe a plain LoRA adapter this server can merge."""
    path = (
        adapter_dir / ADAPTER_CONFIG
        if allowed is None
        else checked_file(adapter_dir, ADAPTER_CONFIG, allowed)
    )
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise WeightLoadError(
            f"{ADAPTER_CONFIG} in {adapter_dir} is unreadable: {type(e).__name__}"
        ) from None
    if not isinstance(doc, dict) or doc.get("peft_type") != "LORA":
        raise WeightLoadError(f"{ADAPTER_CONFIG}: peft_type must be LORA, got {doc.get('peft_type')!r}")
    r, alpha = doc.get("r"), doc.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise WeightLoadError(f"{ADAPTER_CONFIG}: r must be an integer >= 1, got {r!r}")
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, int | float)
        or not math.isfinite(alpha)
        or not 0 < alpha <= MAX_LORA_ALPHA
    ):
        raise WeightLoadError(
            f"{ADAPTER_CONFIG}: lora_alpha must be a finite number in (0, {MAX_LORA_ALPHA:g}], got {alpha!r}"
        )
    if doc.get("bias", "none") != "none":
        raise WeightLoadError(f"{ADAPTER_CONFIG}: bias={doc['bias']!r} is not supported (use 'none')")
    used = [f"{k}={doc[k]!r}" for k in UNSUPPORTED if doc.get(k)]
    if used:
        raise WeightLoadError(f"{ADAPTER_CONFIG}: not supported by the CPU server's merge: {', '.join(used)}")
    return doc


def check_target_modules(model: torch.nn.Module, targets: Any) -> None:
    """Every target names a linear layer of the model (peft's rule: a full name or its last parts).

    Names only: peft reads a string as a regex over the full module names, and a regex from a file
    is refused here (its match time is unbounded: ``(.|.)*Z`` holds the GIL for hours).
    """
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if isinstance(targets, str):
        raise WeightLoadError(
            f"{ADAPTER_CONFIG}: target_modules must be a list of module names, got the string "
            f"{targets[:80]!r} (peft reads a string as a regex, which this server does not run); "
            'save the adapter with target_modules=["q_proj", "v_proj", ...]'
        )
    if (
        not isinstance(targets, list)
        or not targets
        or len(targets) > MAX_TARGET_MODULES
        or not all(isinstance(t, str) and t for t in targets)
    ):
        raise WeightLoadError(
            f"{ADAPTER_CONFIG}: target_modules must be a non-empty list of at most {MAX_TARGET_MODULES} "
            "module names (strings)"
        )
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in linear)]
    if missing:
        have = sorted({n.rsplit(".", 1)[-1] for n in linear})
        raise WeightLoadError(
            f"target module(s) {missing} of the adapter are not in the served model "
            f"(its linear layers are {have}); the adapter was trained on another base model"
        )


def load_checked_adapter(
    model: torch.nn.Module,
    base: dict[str, torch.Tensor],
    model_path: str,
    *,
    max_rank: int | None = None,
    roots: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Read, check and merge the adapter at ``model_path`` into ``base``; ``{param_name: tensor}`` to swap.

    ``base``: the served model's parameters as it started (``name -> tensor``). ``roots``: the server's
    weights roots (files must resolve inside them; inside ``model_path`` when empty). Raises
    ``WeightLoadError`` naming the first problem; nothing is changed then.
    """
    adapter_dir = Path(model_path)
    allowed = allowed_dirs(adapter_dir, roots)
    doc = read_adapter_config(adapter_dir, allowed)
    r = int(doc["r"])
    if max_rank is not None and r > max_rank:
        raise WeightLoadError(f"adapter rank {r} exceeds the server's max_lora_rank {max_rank}")
    check_target_modules(model, doc.get("target_modules"))
    weights = checked_file(adapter_dir, ADAPTER_WEIGHTS, allowed)
    if not weights.is_file():
        raise WeightLoadError(f"no {ADAPTER_WEIGHTS} in {adapter_dir} (adapters load from safetensors only)")
    try:
        tensors = load_file(str(weights), device="cpu")
    except Exception as e:  # safetensors raises its own error types on truncated / corrupt files
        raise WeightLoadError(f"cannot read {ADAPTER_WEIGHTS}: {e}") from e

    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key.removeprefix(_PREFIX))
        if m is None:
            raise WeightLoadError(f"{ADAPTER_WEIGHTS}: tensor {key!r} is not a lora_A / lora_B weight")
        pairs.setdefault(m["module"], {})[m["ab"]] = t
    if not pairs:
        raise WeightLoadError(f"{ADAPTER_WEIGHTS} holds no adapter tensors")

    modules = dict(model.named_modules())
    scale = doc["lora_alpha"] / (math.sqrt(r) if doc.get("use_rslora") else r)
    out = dict(base)
    for name, ab in sorted(pairs.items()):
        layer = modules.get(name)
        if not isinstance(layer, torch.nn.Linear):
            raise WeightLoadError(
                f"the adapter has tensors for {name!r}, which is not a linear layer of the model"
            )
        if set(ab) != {"A", "B"}:
            raise WeightLoadError(
                f"{name}: lora_A and lora_B must both be present, found only lora_{''.join(ab)}"
            )
        a, b = ab["A"], ab["B"]  # [r, in], [out, r]
        w = base[f"{name}.weight"]  # [out, in]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise WeightLoadError(
                f"{name}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not share a rank"
            )
        if a.shape[0] != r:
            raise WeightLoadError(
                f"{name}: the tensors have rank {a.shape[0]}, adapter_config.json says r = {r} (wrong rank)"
            )
        if a.shape[1] != w.shape[1] or b.shape[0] != w.shape[0]:
            raise WeightLoadError(
                f"{name}: lora_B @ lora_A is {b.shape[0]}x{a.shape[1]}, the base layer is "
                f"{w.shape[0]}x{w.shape[1]}; the adapter was trained on another base model"
            )
        if not (_all_finite(a) and _all_finite(b)):
            raise WeightLoadError(f"{name}: the adapter has NaN or inf values")
        merged = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)  # [out, in]
        if not _all_finite(merged):  # finite A, B and alpha can still overflow the served dtype
            raise WeightLoadError(
                f"{name}: the merged weight (base + {scale:g} * B @ A) has NaN or inf values in "
                f"{w.dtype}; the adapter's values or lora_alpha are too large"
            )
        out[f"{name}.weight"] = merged
    return out
