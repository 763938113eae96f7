"""The decoupled PPO loss and aggregation, against hand-worked numbers (one token per column)."""

from __future__ import annotations

import math

import pytest
import torch

from rollflow.training.losses import aggregate, masked_mean, ppo_actor_loss


def _loss(ratio: list[float], adv: list[float], behav_w: list[float] | None = None, **kw):
    """Tokens with the given ratio exp(logp - prox) and behaviour weight exp(prox - behav)."""
    prox = torch.full((1, len(ratio)), -2.0)
    logp = (prox + torch.tensor([ratio]).log()).requires_grad_(True)
    behav = prox - torch.tensor([behav_w if behav_w else [1.0] * len(ratio)]).log()
    out = ppo_actor_loss(logp, prox, behav, torch.tensor([adv]), torch.ones(1, len(ratio)), **kw)
    out.token_loss.sum().backward()
    return out, logp.grad[0]  # type: ignore[index]


def test_standard_clip_four_quadrants() -> None:
    # eps = 0.2. s1 = -A r, s2 = -A clip(r, .8, 1.2), loss = max(s1, s2); d loss / d logp = -A r if unclipped.
    # A=+1 r=1.5: s1=-1.5 s2=-1.2 -> -1.2 clipped, grad 0
    # A=+1 r=0.5: s1=-0.5 s2=-0.8 -> -0.5,          grad -0.5
    # A=-1 r=1.5: s1=+1.5 s2=+1.2 -> +1.5,          grad +1.5
    # A=-1 r=0.5: s1=+0.5 s2=+0.8 -> +0.8 clipped, grad 0
    out, grad = _loss([1.5, 0.5, 1.5, 0.5], [1.0, 1.0, -1.0, -1.0], eps_clip=0.2)
    torch.testing.assert_close(out.token_loss[0].detach(), torch.tensor([-1.2, -0.5, 1.5, 0.8]))
    torch.testing.assert_close(grad, torch.tensor([0.0, -0.5, 1.5, 0.0]))
    assert out.clipped[0].tolist() == [True, False, False, True]


def test_asymmetric_clip_higher() -> None:
    # A=+1 r=1.25: eps_high=0.3 -> clip(1.25, .8, 1.3) = 1.25 -> loss -1.25, not clipped, grad -1.25;
    # with the symmetric 0.2 the same token is clipped at -1.2 (grad 0).
    out, grad = _loss([1.25], [1.0], eps_clip=0.2, eps_clip_higher=0.3)
    assert out.token_loss.item() == pytest.approx(-1.25) and grad.item() == pytest.approx(-1.25)
    assert not out.clipped.any()
    out, grad = _loss([1.25], [1.0], eps_clip=0.2)
    assert out.token_loss.item() == pytest.approx(-1.2) and grad.item() == 0.0


def test_dual_clip_bounds_negative_advantages() -> None:
    # c = 3, A = -1: r=4 -> pg = max(4, 1.2) = 4 > c|A| = 3 -> loss 3 (dual clipped, grad 0)
    #                r=2 -> pg = 2 < 3 -> loss 2 (grad +2)
    # A = +1, r = 4 is untouched by the dual clip: max(-4, -1.2) = -1.2 (PPO clip)
    out, grad = _loss([4.0, 2.0, 4.0], [-1.0, -1.0, 1.0], eps_clip=0.2, c_clip=3.0)
    torch.testing.assert_close(out.token_loss[0].detach(), torch.tensor([3.0, 2.0, -1.2]))
    torch.testing.assert_close(grad, torch.tensor([0.0, 2.0, 0.0]))
    assert out.dual_clipped[0].tolist() == [True, False, False]


def test_behaviour_weight_and_cap_modes() -> None:
    # w = exp(prox - behav) = 2, A = +1, r = 0.5 -> pg = -0.5, loss = w * pg = -1.0, grad = w * (-A r) = -1.0
    out, grad = _loss([0.5], [1.0], behav_w=[2.0])
    assert out.token_loss.item() == pytest.approx(-1.0) and grad.item() == pytest.approx(-1.0)
    assert out.behav_weight.item() == pytest.approx(2.0)
    # cap 1.5, mask: w = 2 > 1.5 -> the token is dropped: loss 0, grad 0, counted as masked
    out, grad = _loss([0.5], [1.0], behav_w=[2.0], behav_imp_weight_cap=1.5, behav_imp_weight_mode="mask")
    assert out.token_loss.item() == 0.0 and grad.item() == 0.0 and out.cap_masked.all()
    # cap 1.5, truncate: w -> 1.5 -> loss -0.75, grad -0.75
    out, grad = _loss([0.5], [1.0], behav_w=[2.0], behav_imp_weight_cap=1.5, behav_imp_weight_mode="truncate")
    assert out.token_loss.item() == pytest.approx(-0.75) and grad.item() == pytest.approx(-0.75)
    assert not out.cap_masked.any()


def test_decoupled_with_prox_equal_behav_is_standard_ppo() -> None:
    torch.manual_seed(0)
    b, t = 4, 9
    behav = -torch.rand(b, t) * 3
    logp = (behav + 0.3 * torch.randn(b, t)).requires_grad_(True)
    adv = torch.randn(b, t)
    mask = (torch.rand(b, t) > 0.3).float()
    out = ppo_actor_loss(logp, behav, behav, adv, mask, eps_clip=0.2, c_clip=3.0, behav_imp_weight_cap=5.0)
    loss = aggregate(out.token_loss, mask)
    (g_dec,) = torch.autograd.grad(loss, logp)

    # standard dual-clip PPO written out directly: r = exp(logp - behav)
    logp2 = logp.detach().clone().requires_grad_(True)
    r = torch.exp(logp2 - behav)
    pg = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))
    pg = torch.where(adv < 0, torch.minimum(pg, -3.0 * adv), pg)
    ref = (pg * mask).sum() / mask.sum()
    (g_std,) = torch.autograd.grad(ref, logp2)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(g_dec, g_std)
    assert torch.equal(out.behav_weight, torch.ones(b, t))  # exp(0) exactly


def test_masked_tokens_get_zero_gradient() -> None:
    logp = torch.tensor([[-1.0, -50.0, -2.1, 30.0]], requires_grad=True)  # garbage where masked
    prox = torch.tensor([[-1.1, -1.0, -2.2, -1.0]])
    behav = torch.tensor([[-1.2, -90.0, -2.1, -1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = ppo_actor_loss(logp, prox, behav, torch.ones(1, 4), mask, behav_imp_weight_cap=5.0)
    aggregate(out.token_loss, mask).backward()
    assert logp.grad is not None
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[0, 3].item() == 0.0
    assert logp.grad[0, 0].item() != 0.0 and logp.grad[0, 2].item() != 0.0
    assert torch.isfinite(out.token_loss).all()
    assert not out.cap_masked[0, 1]  # a masked token is never counted as capped


def test_aggregation_token_and_sequence_mean() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(2.5)
    # seq-mean: (6 / 3 + 4 / 1) / 2 sequences with tokens = 3.0 (the empty row does not count)
    assert aggregate(values, mask, "seq-mean").item() == pytest.approx(3.0)
    # explicit normalisers (the minibatch count across micro-batches): 10 / 8 and (2 + 4) / 4
    assert aggregate(values, mask, "token-mean", normalizer=8.0).item() == pytest.approx(1.25)
    assert aggregate(values, mask, "seq-mean", normalizer=4.0).item() == pytest.approx(1.5)
    assert masked_mean(values, mask).item() == pytest.approx(2.5)
    # seq-mean-token-sum-norm, L = 5: (1 + 2 + 3 + 4) / (2 sequences with tokens * 5) = 1.0
    assert aggregate(values, mask, "seq-mean-token-sum-norm", max_tokens=5).item() == pytest.approx(1.0)
    # with the minibatch normaliser N_seqs * L = 4 * 5: 10 / 20 = 0.5
    assert aggregate(values, mask, "seq-mean-token-sum-norm", normalizer=20.0).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="constant L"):
        aggregate(values, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(values, mask, "sum")  # type: ignore[arg-type]


def test_the_constant_normaliser_weighs_every_token_alike() -> None:
    # Two sequences, lengths 1 and 3, every token loss 1: d loss / d l_it per token.
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    grads = {}
    for mode, kw in (("seq-mean", {}), ("token-mean", {}), ("seq-mean-token-sum-norm", {"max_tokens": 4})):
        values = torch.ones(2, 3, requires_grad=True)
        aggregate(values, mask, mode, **kw).backward()  # type: ignore[arg-type]
        grads[mode] = values.grad
    # seq-mean: 1/(2*1) = 0.5 for the short sequence's token, 1/(2*3) = 1/6 for the long one's (length bias)
    assert grads["seq-mean"][0, 0].item() == pytest.approx(0.5)
    assert grads["seq-mean"][1, 0].item() == pytest.approx(1 / 6)
    # token-mean: 1/4 for every token, but 4 is this batch's token count
    assert grads["token-mean"][0, 0].item() == grads["token-mean"][1, 2].item() == pytest.approx(0.25)
    # constant L = 4: 1/(2*4) = 0.125 for every token, whatever the lengths in the batch
    assert grads["seq-mean-token-sum-norm"][0, 0].item() == pytest.approx(0.125)
    assert grads["seq-mean-token-sum-norm"][1, 2].item() == pytest.approx(0.125)


def test_approx_kl_metric() -> None:
    # r = 2: (r - 1) - ln r = 1 - 0.693147 = 0.306853; r = 1: 0
    out, _ = _loss([2.0, 1.0], [1.0, 1.0])
    torch.testing.assert_close(out.approx_kl[0], torch.tensor([1 - math.log(2.0), 0.0]))


@pytest.mark.parametrize("poisoned", ["behav", "prox", "adv", "logp"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_at_masked_position_does_not_poison_gradient(poisoned: str, bad: float) -> None:
    # Token 0 is a masked prompt token the model finds near-certain (logp -0.01; the trainer's recomputed
    # prox is 0 at masked positions, so the ratio there is ~1, inside the clip range) and it carries its
    # sequence's advantage like every token; tokens 1-2 are trained on. A NaN / inf input at token 0 must
    # leave the loss and every gradient exactly as with a clean value (before the guard, 0 * NaN = NaN in
    # the backward pass of the masked product made the whole gradient NaN).
    def run(value: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = {
            "logp": torch.tensor([[-0.01, -1.0, -2.0]]),
            "prox": torch.tensor([[0.0, -1.1, -1.9]]),
            "behav": torch.tensor([[0.0, -1.2, -2.1]]),
            "adv": torch.tensor([[0.5, 1.0, -1.0]]),
        }
        if value is not None:
            inputs[poisoned][0, 0] = value
        logp = inputs["logp"].requires_grad_(True)
        out = ppo_actor_loss(
            logp, inputs["prox"], inputs["behav"], inputs["adv"], torch.tensor([[0, 1, 1]]),
            behav_imp_weight_cap=5.0,
        )  # fmt: skip
        loss = aggregate(out.token_loss, torch.tensor([[0, 1, 1]]))
        loss.backward()
        return loss.detach(), logp.grad  # type: ignore[return-value]

    clean_loss, clean_grad = run(None)
    loss, grad = run(bad)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad, clean_grad)
    assert grad[0, 0] == 0.0


def test_aggregate_ignores_non_finite_masked_values() -> None:
    # token-mean over the two kept tokens: (1 + 3) / 2 = 2; seq-mean: row 0 (1 + 3) / 2 = 2, row 1 has
    # no loss token and does not count -> 2. The inf / NaN at masked positions change nothing.
    values = torch.tensor([[1.0, math.inf, 3.0], [math.nan, math.nan, math.nan]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    for mode in ("token-mean", "seq-mean"):
        out = aggregate(values, mask, mode)  # type: ignore[arg-type]
        assert out.item() == pytest.approx(2.0)
        (grad,) = torch.autograd.grad(out, values)
        torch.testing.assert_close(grad, torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]]))
