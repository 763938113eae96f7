"""LoRA adapters on the policy: wrap it with ``peft``, name its adapter tensors, and switch them off.

What it is: with ``train.lora.rank = r > 0`` every target linear layer y = W x gets a trainable rank-r
update, and only A and B are trained (W stays frozen: no gradient, no optimizer state):

    y = W x + (alpha / r) * B (A dropout(x))          A: [r, in], B: [out, r], B = 0 at the start

so version 0 (B = 0) is the base model exactly. Four pieces the trainer uses:

- ``apply_lora``: checks that every ``target_modules`` name exists in the model (a missing one is a
  ``ConfigError`` listing the linear layers there are), then ``peft.get_peft_model``. A's random
  initialisation uses ``seed`` alone, never the rank's seed, so every rank of DDP/FSDP2 starts from the
  same adapter;
- ``adapter_tensors``: the adapter's tensors out of a full state dict, renamed to peft's saved format
  (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``), which is what
  ``adapter_model.safetensors`` holds and what ``PeftModel.from_pretrained`` and vLLM read;
- ``adapter_config``: the ``adapter_config.json`` document, naming the base model;
- ``AdapterDisabled``: the reference policy for the KL term, i.e. the same module run inside
  ``disable_adapter()``: pi_ref = the base model, with no second copy of the weights.

A resume point holds the adapter and its optimizer state only (``distributed.full_model_state_dict(...,
trainable_only=True)``): the frozen base is re-read from ``model.path`` on restart.

``merge_adapter_dir`` writes base + adapter as one full Hugging Face directory (peft's merge), which is
what the registry gets for a LoRA run, so the registered model deploys like any other.

What it is not: the servers' merge (``infra/cpu_server/adapters.py``), publishing
(``publish.write_adapter_dir``), or a choice of rank / lr (docs/lora.md has the measured ones).
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from rollflow.api.config import LoraConfig
from rollflow.api.errors import ConfigError
from rollflow.training.distributed import unwrap

ADAPTER_NAME = "default"  # peft's name of the one adapter; it never appears in the saved files
_LORA_KEY = re.compile(rf"\.(lora_[AB])\.{ADAPTER_NAME}\.weight$")


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last name part of every ``nn.Linear`` in ``model`` (``q_proj``, ``lm_head``, ...), sorted."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """ConfigError unless every target names the last part of some linear layer's name."""
    have = linear_module_names(model)
    missing = [t for t in targets if t not in have]
    if missing:
        raise ConfigError(
            "train.lora.target_modules",
            f"{missing} match no linear layer of {type(model).__name__}; its linear layers are {have}",
        )


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, *, seed: int) -> torch.nn.Module:
    """The policy as a ``peft`` model with rank-``cfg.rank`` adapters; only they require grad."""
    import peft

    check_targets(model, list(cfg.target_modules))
    peft_cfg = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # same A on every rank
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        torch.manual_seed(seed)
        wrapped = peft.get_peft_model(model, peft_cfg, adapter_name=ADAPTER_NAME)
    return wrapped


def adapter_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The lora_A / lora_B tensors of a full state dict, under peft's saved names (adapter name dropped)."""
    return {_LORA_KEY.sub(r".\1.weight", k): v for k, v in state_dict.items() if _LORA_KEY.search(k)}


def adapter_config(model: torch.nn.Module, base_model: str) -> dict[str, Any]:
    """``adapter_config.json`` of the policy's adapter, with ``base_model_name_or_path = base_model``."""
    cfg = unwrap(model).peft_config[ADAPTER_NAME]  # type: ignore[index]
    doc = cfg.to_dict()
    doc["base_model_name_or_path"] = base_model
    doc["target_modules"] = sorted(doc["target_modules"])  # a set in memory: JSON wants a list
    doc["inference_mode"] = True  # as peft saves it: the published adapter is for serving
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in doc.items()}


class AdapterDisabled(torch.nn.Module):
    """The policy with its adapter switched off: the frozen reference pi_ref = base, sharing the weights.

    Not a submodule owner (the policy is held outside ``_modules``), so it adds no parameters and no
    state dict entries; ``train``/``eval`` reach the policy, so the reference pass runs in eval mode.
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)

    def train(self, mode: bool = True) -> AdapterDisabled:
        self.policy.train(mode)
        return super().train(mode)

    def forward(self, **kwargs: Any) -> Any:
        with unwrap(self.policy).disable_adapter():  # type: ignore[operator]
            return self.policy(**kwargs)


def merge_adapter_dir(base_path: str, adapter_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: the base model with the adapter merged in (W + (alpha / r) B A), its tokenizer and
    generation config; a plain ``from_pretrained`` directory. Replaces ``out_dir`` if it exists."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, trust_remote_code=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(base_path, trust_remote_code=False).save_pretrained(out_dir)
    return out_dir
