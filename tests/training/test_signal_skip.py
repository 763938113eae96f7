"""Leaving zero-advantage groups out of the passes changes no update, only the work (trainer step 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import make_group
from transformers import AutoModelForCausalLM

from rollflow.api.config import TrainConfig
from rollflow.training.actor import PolicyActor
from rollflow.training.batching import build_batch, signal_groups
from rollflow.training.distributed import DistContext
from rollflow.training.microbatch import MinibatchPlan, keep_groups, plan_step


def _groups(rewards: list[list[float]]) -> list:
    out = []
    for i, rs in enumerate(rewards):
        g = make_group(f"g{i}", n=len(rs))
        for row, r in zip(g.rows, rs, strict=True):
            row.reward = r
        out.append(g)
    return out


def _update(model_dir: Path, rewards: list[list[float]], *, skip: bool, n_mb: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = TrainConfig(batch_size=len(rewards), max_tokens_per_mb=40, ppo_n_minibatches=n_mb, grad_clip=1.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    actor = PolicyActor(model, opt, sched, DistContext(), cfg)
    batch = build_batch(_groups(rewards))
    plans = plan_step(
        [g.n_tokens for g in batch.groups], n_minibatches=n_mb, world_size=1, rank=0, max_tokens_per_mb=40
    )
    for _ in range(2):  # two steps: the second runs with AdamW moments from the first
        batch.advantages = actor.compute_advantages(batch)
        use = keep_groups(plans, signal_groups(batch), keep_empty=False) if skip else plans
        batch.prox_logp = actor.compute_logp(model, batch, use)
        actor.ppo_update(batch, use)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize("n_mb", [1, 2])
def test_skipping_zero_advantage_groups_gives_the_same_weights(tiny_model_dir: Path, n_mb: int) -> None:
    # groups 0 and 2 are all-wrong / all-right: advantage 0 on every row
    rewards = [[0.0] * 4, [1.0, 0.0, 0.0, 1.0], [1.0] * 4, [0.0, 0.0, 1.0, 0.0]]
    full = _update(tiny_model_dir, rewards, skip=False, n_mb=n_mb)
    skipped = _update(tiny_model_dir, rewards, skip=True, n_mb=n_mb)
    for k in full:
        torch.testing.assert_close(skipped[k], full[k], atol=1e-6, rtol=1e-5)


def test_all_zero_batch_still_steps_like_a_zero_gradient(tiny_model_dir: Path) -> None:
    # the first step has signal (AdamW moments become non-zero); with no signal the second step still
    # moves the weights through momentum, exactly as the full zero-gradient pass does
    full = _update(tiny_model_dir, [[1.0] * 4, [0.0] * 4], skip=False, n_mb=1)
    skipped = _update(tiny_model_dir, [[1.0] * 4, [0.0] * 4], skip=True, n_mb=1)
    for k in full:
        torch.testing.assert_close(skipped[k], full[k], atol=1e-7, rtol=1e-6)


def test_signal_groups_and_keep_groups_by_hand() -> None:
    batch = build_batch(_groups([[0.0] * 3, [1.0, 0.0, 1.0], [1.0] * 3]))
    batch.advantages = torch.tensor([0.0, 0.0, 0.0, 0.5, -1.0, 0.5, 0.0, 0.0, 0.0])
    assert signal_groups(batch) == {1}
    plans = [MinibatchPlan(groups=[0, 1, 2], micro_batches=[[0, 2], [1]])]
    # the normaliser's groups stay; the emptied micro-batch goes (one rank) or stays (several ranks)
    assert keep_groups(plans, {1}, keep_empty=False) == [MinibatchPlan(groups=[0, 1, 2], micro_batches=[[1]])]
    assert keep_groups(plans, {1}, keep_empty=True) == [
        MinibatchPlan(groups=[0, 1, 2], micro_batches=[[], [1]])
    ]
    assert keep_groups(plans, set(), keep_empty=False) == [
        MinibatchPlan(groups=[0, 1, 2], micro_batches=[[]])
    ]
