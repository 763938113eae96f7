"""Per-token logprobs and entropy of a causal LM on a right-padded batch.

What it is: ``gather_logprobs`` / ``entropy_from_logits`` (pure, on logits) and ``forward_logprobs``
(one model forward). Output tensors are aligned with the input tokens: position t holds the score of
token t given tokens < t, computed from the logits at position t - 1; position 0 holds 0.

    logp[b, t]    = z[b, t-1, x_t] / tau - logsumexp_v(z[b, t-1, v] / tau)
    entropy[b, t] = -sum_v p_v log p_v,  p = softmax(z[b, t-1] / tau)

``tau`` is the sampling temperature of the rollout (the behaviour logprobs were taken at that
temperature, so the trainer's must be too). Half-precision logits are upcast to float32 first.
What it is not: a loss, or micro-batching (``actor.py`` calls this once per micro-batch).

The attention mask is deliberately not passed to the model: rows are right-padded, so with causal
attention no real token ever attends to a pad, and omitting the mask keeps SDPA on its fused causal
path. Logprobs at pad positions are garbage and are always masked out by the loss mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half precisions to float32; float32 / float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> logp [B, T] (0 at t = 0). Differentiable w.r.t. logits."""
    z = _upcast(logits[:, :-1])  # [B, T-1, V]
    if temperature != 1.0:
        z = z / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)  # [B, T-1, 1]
    lp = z.gather(-1, targets).squeeze(-1) - torch.logsumexp(z, dim=-1)  # [B, T-1]
    return F.pad(lp, (1, 0))  # [B, T]


@torch.no_grad()
def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    chunk: int = 4096,
) -> torch.Tensor:
    """logits [B, T, V] -> entropy [B, T] of the distribution that predicts token t (0 at t = 0).

    With ``mask`` [B, T], only positions where it is non-zero are computed (others are 0), ``chunk``
    positions at a time, so a large vocabulary never needs a second full [B, T, V] float32 tensor.
    """
    b, t, _ = logits.shape
    out = torch.zeros(b, t, dtype=_upcast(logits[:0]).dtype, device=logits.device)  # [B, T]
    if t < 2:
        return out
    sel = torch.ones(b, t - 1, dtype=torch.bool, device=logits.device) if mask is None else mask[:, 1:].bool()
    rows, cols = sel.nonzero(as_tuple=True)  # [N], [N]: position t-1 predicts token t
    for s in range(0, rows.numel(), chunk):
        r, c = rows[s : s + chunk], cols[s : s + chunk]
        z = _upcast(logits[r, c])  # [n, V]
        if temperature != 1.0:
            z = z / temperature
        logp = torch.log_softmax(z, dim=-1)  # [n, V]
        out[r, c + 1] = -(logp.exp() * logp).sum(-1)
    return out


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    entropy_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward of a HF causal LM; returns (logp [B, T], entropy [B, T] on ``entropy_mask`` or None)."""
    out = model(input_ids=input_ids, use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out[0]  # [B, T, V]
    logp = gather_logprobs(logits, input_ids, temperature)
    entropy = None
    if entropy_mask is not None:
        entropy = entropy_from_logits(logits.detach(), temperature, mask=entropy_mask)
    return logp, entropy
