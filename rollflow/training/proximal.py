"""The proximal policy's logprobs without a forward pass (A-3PO, arXiv 2512.06547): ``train.proximal: approx``.

What it is: one pure tensor function, ``approx_proximal_logp``, and the version arithmetic it rests on.
What it is not: the loss (``losses.py``), the forward pass it replaces (``actor.PolicyActor.compute_logp``,
``train.proximal: forward``, the default) or the choice of when to call it (``actor.ppo_update``).

Versions in rollflow. The trainer's version V counts the optimizer steps applied; a step starts from the
weights of version V and publishes V + 1. Every generated token carries v_b, the version of the weights
that sampled it (v_b <= V; -1 on prompt and environment tokens, which the loss never sees). The
decoupled loss's proximal policy is the weights at the step's start, pi_V: the forward mode scores the
batch with them in one extra no-grad pass before the update.

A step makes U = ppo_n_minibatches x ppo_epochs optimizer updates. When a minibatch is taken, u of them
(0 <= u < U) are already applied (an update skipped for a non-finite gradient norm does not count), so
the current weights theta sit, in versions, at

    v_c = V + u / U

Assumption: along the path pi_{v_b} -> pi_V -> pi_theta a token's logprob moves linearly in log space
with the number of optimizer updates, and every step makes the same number of them. The proximal logprob
then lies on the line between the two logprobs the update has without a pass, the behaviour logprob
(stored with the token) and the current one (the update's own forward, detached):

    alpha         = (V - v_b) / (v_c - v_b)    for a token behind (0 <= v_b < V); 0 otherwise
    alpha         = clip(alpha, 0, 1)
    log pi_prox  ~= log pi_behav + alpha * (log pi_theta.detach() - log pi_behav)

Worked cases (the tests check these numbers):

* u = 0 (the first minibatch of the first pass): v_c = V, so alpha = 1 for every token behind, and the
  proximal logprob IS the current one, which is exactly what the forward pass returns (the weights have
  not moved yet). With the defaults (one minibatch, one pass) every update is such an update: the
  approximation is then exact on every off-policy token and saves the pass for free.
* v_b = V (on-policy): alpha = 0, the proximal logprob is the behaviour one. The forward pass would
  score pi_V again, which differs from the behaviour logprob only by the inference engine's numerics.
* V = 4, v_b = 2, U = 2, u = 1 (second minibatch): v_c = 4.5, alpha = 2 / 2.5 = 0.8; a behaviour
  logprob of -2.0 and a current one of -1.0 give -2.0 + 0.8 * 1.0 = -1.2.

What an error costs: the loss's unclipped term w * r = exp(prox - behav) * exp(logp - prox) =
exp(logp - behav) does not depend on the proximal at all; the proximal logprob acts only through the PPO
clip (where r = exp(logp - prox) leaves [1 - eps, 1 + eps_high]) and the importance-weight cap.

Where it is wrong: the line is a first-order picture; the error grows with the updates between v_b and
theta (staleness, and several minibatches or passes per step), and the importance-weight cap
``exp(prox - behav) <= train.behav_imp_weight_cap`` then acts on an estimate. Dropout (``train.lora.dropout``)
makes the current logprob noisy where the forward mode, which scores in eval mode, has none. Groups of an
earlier trial (``train.warm_start_from``) carry that trial's versions, so the config refuses the pair.
"""

from __future__ import annotations

import torch


def weights_version(version: int, updates_done: int, updates_per_step: int) -> float:
    """v_c = V + u / U: where the weights sit, in versions, after ``updates_done`` of this step's updates."""
    if updates_per_step < 1 or not 0 <= updates_done <= updates_per_step:
        raise ValueError(
            f"need 0 <= updates_done <= updates_per_step >= 1, got {updates_done}, {updates_per_step}"
        )
    return version + updates_done / updates_per_step


def approx_proximal_logp(
    behav_logp: torch.Tensor,
    logp: torch.Tensor,
    versions: torch.Tensor,
    *,
    proximal_version: int,
    current_version: float,
) -> torch.Tensor:
    """log pi_prox [B, T] interpolated between ``behav_logp`` and ``logp`` (detached); module docstring.

    behav_logp, logp: [B, T] float; versions: [B, T] int, the version that sampled each token (-1: none).
    ``proximal_version`` is V (the trainer's version at the step's start), ``current_version`` is v_c >= V.
    Tokens not behind V (on-policy, prompt, padding) get their behaviour logprob.
    """
    if current_version < proximal_version:
        raise ValueError(f"current_version {current_version} is before proximal_version {proximal_version}")
    behav = behav_logp.detach()  # [B, T]
    v_b = versions.to(behav.dtype)  # [B, T]
    behind = (versions >= 0) & (versions < proximal_version)  # [B, T] off-policy generated tokens
    span = torch.where(behind, current_version - v_b, torch.ones_like(v_b))  # [B, T] v_c - v_b >= 1 if behind
    alpha = torch.where(behind, (proximal_version - v_b) / span, torch.zeros_like(v_b))  # [B, T]
    alpha = alpha.clamp(0.0, 1.0)  # [B, T]
    # lerp returns its end points exactly at alpha 0 and 1 (b + (l - b) need not round back to l)
    return torch.lerp(behav, logp.detach().to(behav.dtype), alpha)  # [B, T]
