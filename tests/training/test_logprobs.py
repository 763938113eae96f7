"""Token logprobs / entropy alignment, padding invariance, and a finite-difference gradient check."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaForCausalLM

from rollflow.models.random_llama import random_llama
from rollflow.training.kl import kl_estimate
from rollflow.training.logprobs import entropy_from_logits, forward_logprobs, gather_logprobs
from rollflow.training.losses import aggregate, ppo_actor_loss


def test_gather_alignment_hand_worked() -> None:
    # V = 2. Position 0 predicts token 1 with logits [0, ln 3] -> p = [1/4, 3/4]; token 1 is id 1 -> ln(3/4).
    # Position 1 predicts token 2 with logits [0, 0] -> token 2 = id 0 -> ln(1/2). Position 0 holds 0.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [5.0, 5.0]]])
    ids = torch.tensor([[1, 1, 0]])
    lp = gather_logprobs(logits, ids)
    torch.testing.assert_close(lp, torch.tensor([[0.0, math.log(0.75), math.log(0.5)]]))
    # temperature 2 halves logits: [0, ln 3 / 2] -> p(1) = sqrt3 / (1 + sqrt3) = 0.633975
    lp2 = gather_logprobs(logits, ids, temperature=2.0)
    assert lp2[0, 1].item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))), abs=1e-6)
    # entropy of [1/4, 3/4] = -(.25 ln .25 + .75 ln .75) = 0.562335; of [1/2, 1/2] = ln 2
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[0.0, 0.562335, math.log(2.0)]]), atol=1e-6, rtol=0)
    only = entropy_from_logits(logits, mask=torch.tensor([[0.0, 0.0, 1.0]]))
    torch.testing.assert_close(only, torch.tensor([[0.0, 0.0, math.log(2.0)]]))


def _tiny(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    model = random_llama(
        seed=0, dtype=dtype, vocab_size=12, hidden_size=16, intermediate_size=32, max_position_embeddings=64
    )
    return model.eval()


def test_right_padding_does_not_change_logprobs() -> None:
    model = _tiny()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    padded = torch.tensor([[3, 4, 5, 6, 7, 0, 0, 0], [3, 4, 0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        lp, _ = forward_logprobs(model, ids)
        lpp, _ = forward_logprobs(model, padded)
    torch.testing.assert_close(lpp[0, :5], lp[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(lpp[1, :2], lp[0, :2], atol=1e-6, rtol=0)


def test_finite_difference_gradient_of_the_full_loss() -> None:
    """d loss / d lm_head.weight by autograd == central differences (float64, decoupled PPO + k3 KL)."""
    model = _tiny(torch.float64)
    ids = torch.tensor([[1, 5, 7, 2, 9, 4], [3, 3, 8, 1, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]], dtype=torch.float64)
    params = dict(model.named_parameters())
    w0 = params["lm_head.weight"].detach().clone()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        prox, _ = forward_logprobs(model, ids)  # ratio = 1 at w0: far from the clip kinks at 0.8 / 1.2
    behav = prox + 0.1 * torch.randn(prox.shape, generator=gen, dtype=torch.float64)
    ref = prox + 0.2 * torch.randn(prox.shape, generator=gen, dtype=torch.float64)
    adv = torch.tensor([[0.7], [-1.3]], dtype=torch.float64).expand_as(mask)

    def loss_of(w: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(model, {**params, "lm_head.weight": w}, (ids,), {"use_cache": False})
        logp = gather_logprobs(out.logits, ids)
        res = ppo_actor_loss(logp, prox, behav, adv, mask, eps_clip=0.2, c_clip=3.0, behav_imp_weight_cap=5.0)
        tok = res.token_loss + 0.05 * kl_estimate(logp, ref, "k3") * mask
        return aggregate(tok, mask, "seq-mean")

    assert torch.autograd.gradcheck(
        loss_of, (w0.clone().requires_grad_(True),), eps=1e-6, atol=1e-7, rtol=1e-5
    )
