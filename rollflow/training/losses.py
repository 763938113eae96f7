"""The decoupled PPO policy loss (AReaL), with asymmetric and dual clipping, and loss aggregation.

What it is: pure tensor functions over [B, T] per-token tensors. No model, no optimizer, no config.
What it is not: the KL penalty (``kl.py``), advantages (``advantages.py``) or the training loop.

Per token t with advantage A, current logp, proximal logp (the step's starting policy, no grad; see below)
and behaviour logp (from the inference server that sampled the token):

    r      = exp(logp - prox_logp)                                  ratio against the proximal policy
    s1     = -A * r
    s2     = -A * clip(r, 1 - eps_clip, 1 + eps_high)               eps_high = eps_clip_higher or eps_clip
    pg     = max(s1, s2)                                            PPO's pessimistic surrogate
    pg     = min(pg, -c_clip * A)     where A < 0                   dual clip (only if c_clip is set)
    w      = exp(prox_logp - behav_logp)                            behaviour importance weight (no grad)
    cap:   mask     -> tokens with w > cap contribute 0
           truncate -> w = min(w, cap)
    loss_t = w * pg  on tokens with loss_mask = 1, else 0

Where prox_logp comes from (``train.proximal``): by default (``forward``) a no-grad forward pass of the
step's starting weights, one per micro-batch before the update. ``approx`` (opt-in; A-3PO) skips that
pass and interpolates each token's proximal logprob in log space between its behaviour logprob and the
current logp (detached), by how many versions the token is behind: ``proximal.py`` has the formula, its
assumptions and worked numbers. With one minibatch and one pass per step it gives the forward pass's
values on every off-policy token; on-policy tokens take their behaviour logprob (``w = 1``).

With the decoupled loss off the caller passes ``prox_logp = behav_logp``, so ``w = 1`` and this is
standard PPO with ratio ``exp(logp - behav_logp)``. The log ratio is clamped to [-20, 20] before exp
(float32 overflows past ~88); tokens that far off-policy are clipped by any sane eps anyway.

Masked positions (loss_mask = 0: prompt, padding, environment tokens) never reach the loss, but a
product is no guard: in the backward pass ``0 * NaN = NaN``, so one NaN behaviour logprob on a prompt
token would turn the whole step's gradient NaN. Every input is therefore replaced by 0 at masked
positions (``torch.where``, whose backward passes exactly 0 there) before any arithmetic, and
``aggregate`` selects rather than multiplies.

Aggregation over a micro-batch (``normalizer`` lets the caller divide by a count over the whole
minibatch, all micro-batches and ranks, so gradient accumulation reproduces the full-batch loss):

    token-mean:               sum_{i,t} m_it * l_it / N_tokens
    seq-mean:                 sum_i ( sum_t m_it * l_it / sum_t m_it ) / N_seqs
    seq-mean-token-sum-norm:  sum_{i,t} m_it * l_it / (N_seqs * L)          L a constant (Dr.GRPO)

Why the third (Dr.GRPO's constant normaliser). Write |o_i| = sum_t m_it and ask what weight one
token's loss gets in each rule:

    seq-mean:     1 / (N_seqs * |o_i|)      depends on its own sequence's length
    token-mean:   1 / sum_j |o_j|           depends on the lengths of the whole batch
    constant L:   1 / (N_seqs * L)          the same for every token of every batch

Under seq-mean a token of a long sequence weighs less, so with A < 0 a long wrong answer is pushed
down less per token than a short one, and with A > 0 short right answers are favoured: the length
bias Dr.GRPO removes. token-mean has no bias inside a batch, but its step for a token shrinks when
the batch-mates are long, and E[sum l / sum |o|] is a ratio of sums, not the gradient of one fixed
objective. With a constant L,

    E[ grad (1 / (N_seqs L)) sum_{i,t} m_it l_it ] = (1 / L) * grad E_o[ sum_t m_t l_t ],

the exact gradient of the summed per-token surrogate of one sequence, scaled by 1 / L. L only sets
the step size (like the learning rate); with L = the generation budget (``train.loss_agg_max_tokens``,
default ``rollout.generation.max_new_tokens``), |o_i| <= L, so the loss is never larger than
token-mean's. Pair it with ``adv_norm: mean`` (no std division) for Dr.GRPO as published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean", "seq-mean-token-sum-norm"]
CapMode = Literal["mask", "truncate"]
_LOG_RATIO_CLAMP = 20.0


@dataclass
class PPOLossOutput:
    """Per-token loss plus the detached tensors the trainer turns into metrics. All [B, T]."""

    token_loss: torch.Tensor  # [B, T] w * pg on kept loss tokens, 0 elsewhere; carries the gradient
    ratio: torch.Tensor  # [B, T] exp(logp - prox_logp), detached
    behav_weight: torch.Tensor  # [B, T] exp(prox_logp - behav_logp) before the cap, detached
    clipped: torch.Tensor  # [B, T] bool: the clipped surrogate s2 was the active (larger) one
    dual_clipped: torch.Tensor  # [B, T] bool: the dual clip bound the loss (A < 0)
    cap_masked: torch.Tensor  # [B, T] bool: loss tokens dropped because w > cap (mode "mask")
    approx_kl: torch.Tensor  # [B, T] k3 estimate of KL(prox || current): (r - 1) - log r, detached


def ppo_actor_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    behav_imp_weight_cap: float | None = None,
    behav_imp_weight_mode: CapMode = "mask",
) -> PPOLossOutput:
    """Decoupled PPO token loss; formulas in the module docstring.

    logp: [B, T] (requires grad); prox_logp, behav_logp, advantages: [B, T]; loss_mask: [B, T] in {0, 1}.
    """
    if c_clip is not None and c_clip <= 1:
        raise ValueError(f"c_clip must be > 1, got {c_clip}")
    if behav_imp_weight_mode not in ("mask", "truncate"):
        raise ValueError(f"unknown behav_imp_weight_mode {behav_imp_weight_mode!r}; use 'mask' or 'truncate'")
    mask = loss_mask.bool()  # [B, T]
    eps_high = eps_clip if eps_clip_higher is None else eps_clip_higher
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp = torch.where(mask, logp, zero)  # [B, T] masked positions: a constant, gradient exactly 0
    prox_logp = torch.where(mask, prox_logp.detach(), zero)  # [B, T]
    behav_logp = torch.where(mask, behav_logp.detach(), zero)  # [B, T]
    adv = torch.where(mask, advantages.detach(), zero)  # [B, T]

    log_ratio = (logp - prox_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    s1 = -adv * ratio  # [B, T]
    s2 = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + eps_high)  # [B, T]
    pg = torch.maximum(s1, s2)  # [B, T]
    clipped = (s2 > s1) & mask
    dual_clipped = torch.zeros_like(mask)
    if c_clip is not None:
        bound = -c_clip * adv  # [B, T] positive where adv < 0
        neg = adv < 0
        dual_clipped = neg & (pg > bound) & mask
        pg = torch.where(neg, torch.minimum(pg, bound), pg)

    behav_weight = torch.exp((prox_logp - behav_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))  # [B, T]
    weight = behav_weight
    keep = mask
    cap_masked = torch.zeros_like(mask)
    if behav_imp_weight_cap is not None:
        if behav_imp_weight_mode == "mask":
            cap_masked = (behav_weight > behav_imp_weight_cap) & mask
            keep = mask & ~cap_masked
        else:
            weight = behav_weight.clamp(max=behav_imp_weight_cap)

    token_loss = torch.where(keep, weight * pg, torch.zeros_like(pg))  # [B, T]
    with torch.no_grad():
        r = ratio.detach()
        approx_kl = torch.where(mask, (r - 1.0) - log_ratio.detach(), torch.zeros_like(r))
    return PPOLossOutput(
        token_loss=token_loss,
        ratio=ratio.detach(),
        behav_weight=behav_weight,
        clipped=clipped,
        dual_clipped=dual_clipped,
        cap_masked=cap_masked,
        approx_kl=approx_kl,
    )


def aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: LossAgg = "token-mean",
    *,
    normalizer: float | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar (formulas in the module docstring).

    ``normalizer`` replaces N_tokens (token-mean), N_seqs (seq-mean) or N_seqs * L
    (seq-mean-token-sum-norm); by default they are counted in this batch (sequences without loss
    tokens do not count). ``max_tokens`` is the constant L, required by seq-mean-token-sum-norm.
    """
    m = loss_mask.to(values.dtype)  # [B, T]
    kept = torch.where(loss_mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    if mode == "seq-mean-token-sum-norm":
        if normalizer is None:
            if max_tokens is None or max_tokens < 1:
                raise ValueError("loss_agg 'seq-mean-token-sum-norm' needs its constant L (max_tokens >= 1)")
            normalizer = float((m.sum(-1) > 0).sum().clamp_min(1).item()) * max_tokens
        return kept.sum() / normalizer
    if mode == "token-mean":
        denom = normalizer if normalizer is not None else m.sum().clamp_min(1.0)
        return kept.sum() / denom
    if mode == "seq-mean":
        n_tok = m.sum(-1)  # [B]
        per_seq = kept.sum(-1) / n_tok.clamp_min(1.0)  # [B]
        denom = normalizer if normalizer is not None else (n_tok > 0).sum().clamp_min(1).to(values.dtype)
        return per_seq.sum() / denom
    raise ValueError(f"unknown loss_agg {mode!r}; use 'token-mean', 'seq-mean' or 'seq-mean-token-sum-norm'")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum(values * mask) / max(1, sum(mask))``; any shape."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp_min(1.0)
