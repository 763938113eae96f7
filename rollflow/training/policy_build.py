"""Building the policy a trainer trains: model, reference, optimizer, scheduler and the per-rank actor.

What it is: ``build_policy(cfg, ctx)`` seeds torch, ``random`` and numpy with ``seed + rank``, loads the HF model and tokenizer from ``model.path`` (float32
master weights, ``trust_remote_code`` as configured), turns on gradient checkpointing if asked, wraps the
model with LoRA (``train.lora.rank > 0``) before DDP/FSDP2 so only the adapter trains, builds the KL
reference when ``train.kl_ctl > 0`` (a frozen copy of the initial policy, or, with LoRA, the same model
with its adapter switched off: no second copy), AdamW with warmup + constant/cosine, and the
``PolicyActor`` that runs the passes. It returns them as one ``Policy``.

What it is not: the training loop (``trainer``), the loss (``losses``) or the passes (``actor``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rollflow.api.config import ExperimentConfig
from rollflow.training import distributed as D
from rollflow.training.actor import PolicyActor
from rollflow.training.lora import AdapterDisabled, apply_lora
from rollflow.training.optim import build_optimizer, build_scheduler
from rollflow.training.publish import tied_aliases


@dataclass
class Policy:
    """What ``build_policy`` made; ``model`` is wrapped for DDP/FSDP2 (and LoRA)."""

    tokenizer: Any
    model: torch.nn.Module
    ref_model: torch.nn.Module | None  # None without a KL term
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    actor: PolicyActor
    hf_config: Any  # the model's config, saved with each checkpoint
    generation_config: Any
    architecture: str
    tied: set[str]  # state-dict names that alias another tensor (left out of checkpoints)


def build_policy(cfg: ExperimentConfig, ctx: D.DistContext) -> Policy:
    """See the module docstring. Every rank builds the same policy (collectives inside the wrapping)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    seed = cfg.seed + ctx.rank
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    tcfg, lora = cfg.train, cfg.train.lora.enabled
    path, trust = cfg.model.path, cfg.model.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust)
    hf_config, architecture = model.config, type(model).__name__
    generation_config = getattr(model, "generation_config", None)
    tied = tied_aliases(model)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:  # before DDP/FSDP2 wrapping: they see the frozen base and the trainable adapter
        model = apply_lora(model, tcfg.lora, seed=cfg.seed)
    ref_model: torch.nn.Module | None = None
    if tcfg.kl_ctl > 0 and not lora:  # the frozen initial policy, from model.path (also on resume)
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust)
        ref_model = D.freeze_reference(ref, ctx)
    wrapped = D.wrap_model(model, ctx, bf16=tcfg.dtype == "bfloat16")
    if tcfg.kl_ctl > 0 and lora:  # the base = the policy without its adapter: no second copy
        ref_model = AdapterDisabled(wrapped)
    optimizer = build_optimizer(
        wrapped.named_parameters(),
        lr=tcfg.lr,
        weight_decay=tcfg.weight_decay,
        betas=(float(tcfg.adam_betas[0]), float(tcfg.adam_betas[1])),
    )
    scheduler = build_scheduler(
        optimizer,
        warmup_steps=tcfg.warmup_steps,
        total_steps=tcfg.steps,
        schedule=tcfg.lr_schedule,
        min_lr_ratio=tcfg.min_lr_ratio,
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    actor = PolicyActor(
        wrapped,
        optimizer,
        scheduler,
        ctx,
        tcfg,
        temperature=cfg.rollout.generation.temperature,
        pad_id=int(pad_id),
        loss_max_tokens=tcfg.loss_agg_max_tokens or cfg.rollout.generation.max_new_tokens,
    )
    return Policy(
        tokenizer,
        wrapped,
        ref_model,
        optimizer,
        scheduler,
        actor,
        hf_config,
        generation_config,
        architecture,
        tied,
    )
