"""Sequence-level advantages from group rewards: GRPO (mean or mean/std) and RLOO, plus reward shaping.

What it is: pure tensor functions, one advantage per sequence. Groups may have different sizes; a
group is identified by ``group_index`` (0..G-1 per sequence), so no padding to a common group size.
What it is not: token-level credit assignment (GAE / value functions); every token of a sequence gets
its sequence's advantage (the trainer broadcasts it over the loss mask).

Formulas (r_i: shaped reward of sequence i, g: its group, n_g: group size, mean_g / std_g over g):

    shaping:         r_i = clip(scale * reward_i, -c, c)                   (clip only if c is set)
    GRPO mean:       A_i = r_i - mean_g                                     (Dr.GRPO's advantage)
    GRPO mean_std:   A_i = (r_i - mean_g) / (std_g + eps)                   (std unbiased, n_g - 1)
    RLOO:            A_i = r_i - (sum_g - r_i) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g)

A group of one sequence has no baseline: its advantage is 0 under every estimator.

``mean`` is only half of Dr.GRPO: its loss also divides by a constant instead of the sequence or
batch token count (``train.loss_agg: seq-mean-token-sum-norm``, derived in ``losses.py``). With the
default ``token-mean`` aggregation, ``mean`` is GRPO without the std division and nothing more.
"""

from __future__ import annotations

from typing import Literal

import torch

AdvEstimator = Literal["grpo", "rloo"]
AdvNorm = Literal["mean_std", "mean"]


def shape_rewards(rewards: torch.Tensor, scale: float = 1.0, clip: float | None = None) -> torch.Tensor:
    """``clip(scale * rewards, -clip, clip)``; shape preserved."""
    out = rewards * scale  # [B]
    if clip is not None:
        out = out.clamp(-clip, clip)
    return out


def _group_sums(values: torch.Tensor, group_index: torch.Tensor, n_groups: int) -> torch.Tensor:
    out = torch.zeros(n_groups, dtype=values.dtype, device=values.device)  # [G]
    return out.index_add_(0, group_index, values)


def group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    estimator: AdvEstimator = "grpo",
    norm: AdvNorm = "mean_std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage per sequence (formulas in the module docstring).

    rewards: [B] float (already shaped); group_index: [B] int64 in 0..G-1. Returns [B], same dtype.
    ``norm`` applies to GRPO only; RLOO's baseline is unnormalised, as in the paper.
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} must be [B]"
        )
    if rewards.numel() == 0:
        return rewards.clone()
    r = rewards.to(torch.float64)  # [B] float64: group statistics are cheap and must not drift
    gi = group_index.long()
    n_groups = int(gi.max().item()) + 1
    ones = torch.ones_like(r)
    n = _group_sums(ones, gi, n_groups)[gi]  # [B] size of each sequence's group
    mean = (_group_sums(r, gi, n_groups) / _group_sums(ones, gi, n_groups).clamp_min(1))[gi]  # [B]
    centred = r - mean  # [B]
    single = n <= 1
    if estimator == "rloo":
        adv = centred * n / (n - 1).clamp_min(1)
    elif estimator == "grpo":
        if norm == "mean":
            adv = centred
        elif norm == "mean_std":
            var = _group_sums(centred * centred, gi, n_groups)[gi] / (n - 1).clamp_min(1)  # [B] unbiased
            adv = centred / (var.sqrt() + eps)
        else:
            raise ValueError(f"unknown adv_norm {norm!r}; use 'mean_std' or 'mean'")
    else:
        raise ValueError(f"unknown adv_estimator {estimator!r}; use 'grpo' or 'rloo'")
    adv = torch.where(single, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)
