"""Per-token KL estimators between the policy and a frozen reference (Schulman's k1, k2, k3).

What it is: one pure function. Tokens are sampled from (approximately) the policy pi, and with the log
ratio ``d = logp - ref_logp = log pi(x) / pi_ref(x)``:

    k1 = d                          unbiased, high variance, can be negative
    k2 = d^2 / 2                    biased, low variance, >= 0
    k3 = exp(-d) - 1 + d            unbiased, low variance, >= 0  (GRPO's choice)

What it is not: a loss. The trainer multiplies the masked estimate by ``kl_ctl`` and adds it to the PPO
token loss. ``d`` is clamped to [-20, 20] so k3's exp cannot overflow on a token the reference finds
impossible.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
_CLAMP = 20.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref); logp, ref_logp: [B, T] -> [B, T]. Gradient flows to logp."""
    d = (logp - ref_logp).clamp(-_CLAMP, _CLAMP)  # [B, T]
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(-d) - 1.0 + d
    raise ValueError(f"unknown kl_estimator {kind!r}; use 'k1', 'k2' or 'k3'")
