"""Advantage estimators and reward shaping, checked against hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from rollflow.training.advantages import group_advantages, shape_rewards

# Two groups, interleaved on purpose: group 0 = rewards [1, 0, 0, 1], group 1 = [2, 4].
REWARDS = torch.tensor([1.0, 2.0, 0.0, 0.0, 4.0, 1.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1, 0])


def test_grpo_mean_std_hand_worked() -> None:
    # group 0: mean 0.5, centred [.5, -.5, -.5, .5], unbiased var = 4 * .25 / 3 = 1/3, std = 0.57735
    #          -> A = +-0.5 / 0.57735 = +-0.866025
    # group 1: mean 3, centred [-1, 1], var = 2 / 1 = 2, std = 1.414214 -> A = -+0.707107
    adv = group_advantages(REWARDS, GROUPS, estimator="grpo", norm="mean_std")
    expected = torch.tensor([0.866025, -0.707107, -0.866025, -0.866025, 0.707107, 0.866025])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_mean_only_dr_grpo() -> None:
    # r - mean_g: group 0 -> [.5, -.5, -.5, .5]; group 1 -> [-1, 1]
    adv = group_advantages(REWARDS, GROUPS, estimator="grpo", norm="mean")
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, -0.5, -0.5, 1.0, 0.5]))


def test_rloo_leave_one_out() -> None:
    # group 0, row 0: 1 - mean(0, 0, 1) = 1 - 1/3 = 2/3; row 1 (r=0): 0 - mean(1, 0, 1) = -2/3
    # group 1: 2 - 4 = -2 and 4 - 2 = 2
    adv = group_advantages(REWARDS, GROUPS, estimator="rloo")
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2.0, -2 / 3, -2 / 3, 2.0, 2 / 3]))


@pytest.mark.parametrize("estimator,norm", [("grpo", "mean_std"), ("grpo", "mean"), ("rloo", "mean_std")])
def test_single_sample_group_has_zero_advantage(estimator: str, norm: str) -> None:
    adv = group_advantages(
        torch.tensor([5.0, 1.0, 3.0]), torch.tensor([0, 1, 1]), estimator=estimator, norm=norm
    )
    assert adv[0].item() == 0.0  # no baseline for a group of one
    assert adv[1].item() < 0 < adv[2].item()


def test_constant_group_gives_zero_not_nan() -> None:
    # all equal rewards: centred 0, std 0 -> 0 / (0 + eps) = 0
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3))


def test_shape_rewards_scale_then_clip() -> None:
    # [3, -3, 0.5] * 2 = [6, -6, 1] -> clip to [-4, 4] -> [4, -4, 1]
    out = shape_rewards(torch.tensor([3.0, -3.0, 0.5]), scale=2.0, clip=4.0)
    torch.testing.assert_close(out, torch.tensor([4.0, -4.0, 1.0]))
    torch.testing.assert_close(shape_rewards(torch.tensor([3.0]), 0.5), torch.tensor([1.5]))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="adv_estimator"):
        group_advantages(REWARDS, GROUPS, estimator="gae")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be"):
        group_advantages(REWARDS[:, None], GROUPS)
