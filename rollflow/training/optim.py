"""AdamW and its learning-rate schedule: linear warmup, then constant or cosine decay.

What it is: ``build_optimizer`` (AdamW; weight decay only on matrices, never on norms and biases) and
``lr_factor`` / ``build_scheduler`` (a LambdaLR stepped once per training step, i.e. per version).
What it is not: gradient clipping across ranks (``distributed.clip_grad_norm``) or the update loop.

With s = completed training steps (0 before the first update), W = warmup steps, S = total steps,
m = min_lr_ratio:

    s < W:       f(s) = (s + 1) / W                        (the first update already has a non-zero lr)
    constant:    f(s) = 1
    cosine:      f(s) = m + (1 - m) * (1 + cos(pi * p)) / 2,   p = min(1, (s - W) / max(1, S - W))
    lr(s)      = lr * f(s)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch

Schedule = Literal["constant", "cosine"]


def build_optimizer(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over trainable parameters; 1-D tensors (norm weights, biases) get no weight decay."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for _, p in named_params:
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, schedule: Schedule, min_lr_ratio: float = 0.0
) -> float:
    """Multiplier of the base lr for the update after ``step`` completed steps (formula in the docstring)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr_schedule {schedule!r}; use 'constant' or 'cosine'")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    schedule: Schedule,
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR applying ``lr_factor``; call ``.step()`` once per training step."""

    def factor(step: int) -> float:
        return lr_factor(
            step,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            schedule=schedule,
            min_lr_ratio=min_lr_ratio,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
