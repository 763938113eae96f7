"""KL estimators k1, k2, k3 against hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from rollflow.training.kl import kl_estimate


def test_estimators_hand_worked() -> None:
    # d = logp - ref = 0.5:  k1 = 0.5;  k2 = 0.25 / 2 = 0.125;  k3 = e^-0.5 - 1 + 0.5 = 0.106531
    # d = -1:                k1 = -1;   k2 = 0.5;             k3 = e^1 - 1 - 1 = 0.718282
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[0.5, -1.0]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.125, 0.5]]))
    k3 = kl_estimate(logp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0]]))


def test_k3_is_unbiased_for_the_true_kl() -> None:
    # Categorical pi = [.7, .2, .1], ref = [.4, .4, .2]; KL = sum pi log(pi/ref) = 0.183787 (hand: .7 ln 1.75
    # + .2 ln .5 + .1 ln .5 = .391731 - .138629 - .069315). E_pi[k3] and E_pi[k1] equal it exactly.
    pi = torch.tensor([0.7, 0.2, 0.1])
    ref = torch.tensor([0.4, 0.4, 0.2])
    true_kl = float((pi * (pi / ref).log()).sum())
    assert true_kl == pytest.approx(0.183787, abs=1e-6)
    for kind in ("k1", "k3"):
        per_token = kl_estimate(pi.log()[None], ref.log()[None], kind)[0]
        assert float((pi * per_token).sum()) == pytest.approx(true_kl, abs=1e-6)


def test_gradient_flows_to_logp_only() -> None:
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5]], requires_grad=True)
    kl_estimate(logp, ref.detach(), "k3").sum().backward()
    # d/dd (e^-d - 1 + d) = 1 - e^-d = 1 - e^-0.5 = 0.393469
    assert logp.grad is not None and logp.grad.item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)


def test_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")  # type: ignore[arg-type]
