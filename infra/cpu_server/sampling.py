"""Next-token sampling and behaviour logprobs with SGLang 0.5.23's semantics, for a batch of rows.

What it is: one function, ``sample_rows``, that turns the last-position logits of B sequences into B
tokens and B logprobs, each row with its own temperature / top-k / top-p / min-p / seed.

What it is not: no model, no cache, no request bookkeeping (``engine.py``).

Semantics (as SGLang's default sampler, ``sglang/srt/layers/sampler.py``):

- temperature ``T < 1e-6`` is greedy: ``token = argmax(logits)``; the logprob is ``log_softmax(logits)``.
- otherwise ``p = softmax(logits / T)``. The returned logprob is ``log p[token]``: the logprob of the
  **temperature-scaled** distribution **before** top-k / top-p / min-p filtering (SGLang returns
  ``log(probs)`` of that same tensor unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set). At ``T = 1`` it
  equals a teacher-forced ``log_softmax`` of the model, which is what PPO ratios need.
- filtering on ``p`` sorted descending, exactly as ``top_k_top_p_min_p_sampling_from_probs_torch``:
  rank ``>= top_k`` dropped; a token dropped when the mass *before* it exceeds ``top_p``
  (``cumsum - p > top_p``), so the token that crosses ``top_p`` is kept; min-p drops ``p < min_p * p_max``.
  The survivors are sampled proportionally to ``p`` (renormalised).
- the draw is inverse-CDF with one uniform ``u`` per row. A seeded row (``sampling_seed``) takes
  ``u = splitmix64(seed, position)``, where ``position`` is the absolute index of the token in the sequence,
  so a request resumed from prompt + partial output with the same seed draws the same ``u`` for the same
  position, and a row's draw does not depend on which other rows share the batch.

Worked example (top_p): p = [0.5, 0.3, 0.2], top_p = 0.6 -> mass before each = [0, 0.5, 0.8]; 0.8 > 0.6
drops the third token; the first two are kept and sampled as [0.625, 0.375].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def seeded_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) from (seed, position) with splitmix64; pure and platform independent."""
    x = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xD1B54A32D192ED03) & _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


@dataclass
class RowSampling:
    """What one row needs to draw its next token (already normalised by ``sglang_protocol``)."""

    temperature: float
    top_k: int  # TOP_K_ALL (1 << 30) = all
    top_p: float
    min_p: float
    greedy: bool
    uniform: float  # the draw u in [0, 1); unused when greedy
    banned: tuple[int, ...] = ()  # token ids masked out (stop ids while below min_new_tokens)


def sample_rows(logits: torch.Tensor, rows: list[RowSampling]) -> tuple[list[int], list[float]]:
    """Draw one token per row; returns ``(tokens, logprobs)`` as Python lists.

    logits: ``[B, V]`` float32, the model's last-position logits.
    """
    B, V = logits.shape  # [B, V]
    logits = logits.float()
    if any(r.banned for r in rows):
        logits = logits.clone()
        for i, r in enumerate(rows):
            if r.banned:
                logits[i, list(r.banned)] = float("-inf")
    temps = torch.tensor([r.temperature for r in rows], dtype=logits.dtype).unsqueeze(1)  # [B, 1]
    probs = torch.softmax(logits / temps, dim=-1)  # [B, V]; logprob = log(probs), as SGLang's sampler
    # float64 running sums for large vocabularies, where a float32 cumsum drifts (V * eps).
    cdf_dtype = torch.float64 if V > 32768 else torch.float32
    tokens = [0] * B

    greedy = [i for i, r in enumerate(rows) if r.greedy]
    if greedy:
        g = torch.tensor(greedy)
        for i, t in zip(greedy, logits[g].argmax(dim=-1).tolist(), strict=True):
            tokens[i] = t

    plain = [
        i for i, r in enumerate(rows) if not r.greedy and r.top_k >= V and r.top_p >= 1.0 and r.min_p <= 0.0
    ]
    if plain:
        rows_p = probs if len(plain) == B else probs[torch.tensor(plain)]  # [b, V]
        cdf = rows_p.to(cdf_dtype).cumsum(dim=-1)  # [b, V]
        u = torch.tensor([rows[i].uniform for i in plain], dtype=cdf_dtype).unsqueeze(1)  # [b, 1]
        pick = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=V - 1).squeeze(1)  # [b]
        for i, t in zip(plain, pick.tolist(), strict=True):
            tokens[i] = t

    done = set(greedy) | set(plain)
    filtered = [i for i in range(B) if i not in done]
    if filtered:
        idx = torch.tensor(filtered)
        p_sorted, order = probs[idx].sort(dim=-1, descending=True)  # [b, V]
        top_k = torch.tensor([min(rows[i].top_k, V) for i in filtered]).unsqueeze(1)  # [b, 1]
        top_p = torch.tensor([rows[i].top_p for i in filtered], dtype=probs.dtype).unsqueeze(1)
        min_p = torch.tensor([rows[i].min_p for i in filtered], dtype=probs.dtype).unsqueeze(1)
        ranks = torch.arange(V).unsqueeze(0)  # [1, V]
        drop = ranks >= top_k
        drop |= (p_sorted.cumsum(dim=-1) - p_sorted) > top_p
        drop |= p_sorted < p_sorted[:, :1] * min_p
        kept = p_sorted.masked_fill(drop, 0.0).to(cdf_dtype)  # [b, V]
        cdf = kept.cumsum(dim=-1)
        u = torch.tensor([rows[i].uniform for i in filtered], dtype=cdf_dtype).unsqueeze(1)
        pick = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=V - 1)  # [b, 1]
        chosen = order.gather(1, pick).squeeze(1)  # [b]
        for i, t in zip(filtered, chosen.tolist(), strict=True):
            tokens[i] = t

    picked = torch.tensor(tokens).unsqueeze(1)  # [B, 1]
    lps = probs.gather(1, picked).log_().squeeze(1).tolist()  # [B]
    return tokens, lps
