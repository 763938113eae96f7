"""PolicyActor: micro-batching and minibatch splits change nothing but memory; metrics make sense."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import make_group
from transformers import AutoModelForCausalLM

from rollflow.api.config import TrainConfig
from rollflow.training.actor import PolicyActor
from rollflow.training.batching import build_batch
from rollflow.training.distributed import DistContext
from rollflow.training.microbatch import plan_step


def _run(
    model_dir: Path, *, budget: int, agg: str = "token-mean", n_mb: int = 1, ppo_epochs: int = 1, **kw
) -> tuple[dict, dict]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = TrainConfig(
        batch_size=3, max_tokens_per_mb=budget, loss_agg=agg, ppo_n_minibatches=n_mb, grad_clip=0.0,
        loss_agg_max_tokens=16, ppo_epochs=ppo_epochs, **kw,
    )  # type: ignore[arg-type]  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # the update IS the (negative) gradient
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    actor = PolicyActor(model, opt, sched, DistContext(), cfg)
    batch = build_batch([make_group(f"g{i}", n=3) for i in range(3)])
    plans = plan_step(
        [g.n_tokens for g in batch.groups], n_minibatches=n_mb, world_size=1, rank=0, max_tokens_per_mb=budget
    )
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    batch.prox_logp = actor.compute_logp(model, batch, plans)
    batch.advantages = actor.compute_advantages(batch)
    stats = actor.ppo_update(batch, plans)
    delta = {k: (before[k] - v.detach()) for k, v in model.named_parameters()}
    return delta, stats


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "seq-mean-token-sum-norm"])
def test_gradient_does_not_depend_on_micro_batching(tiny_model_dir: Path, agg: str) -> None:
    whole, s1 = _run(tiny_model_dir, budget=10_000, agg=agg)  # one micro-batch
    split, s2 = _run(tiny_model_dir, budget=1, agg=agg)  # one group per micro-batch (each over budget)
    for k in whole:
        torch.testing.assert_close(split[k], whole[k], atol=1e-6, rtol=1e-5)
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    assert s1["loss_tokens"] == s2["loss_tokens"] > 0


def test_first_minibatch_is_on_policy_then_ratio_moves(tiny_model_dir: Path) -> None:
    _, one = _run(tiny_model_dir, budget=10_000)
    # One minibatch: the loss is taken at the weights that produced prox_logp -> ratio 1, no clipping.
    assert one["approx_kl"] == pytest.approx(0.0, abs=1e-9) and one["clip_frac"] == 0.0
    assert 0.5 < one["behav_weight_mean"] < 2.0 and one["behav_weight_max"] >= one["behav_weight_mean"]
    assert one["entropy"] > 3.0  # a random model over 40 tokens: close to ln 40 = 3.69
    _, three = _run(tiny_model_dir, budget=10_000, n_mb=3)
    # Later minibatches see weights moved by SGD(lr=1): the ratio departs from 1.
    assert three["approx_kl"] > 0.0


def test_ppo_epochs_reuse_the_batch(tiny_model_dir: Path) -> None:
    """Two passes = two updates from one batch; the lr schedule still advances once per step."""
    once, s1 = _run(tiny_model_dir, budget=10_000)
    twice, s2 = _run(tiny_model_dir, budget=10_000, ppo_epochs=2)
    # The second pass starts from the weights the first one moved: the ratio departs from 1 ...
    assert s1["approx_kl"] == pytest.approx(0.0, abs=1e-9) and s2["approx_kl"] > 0.0
    assert s2["loss_tokens"] == 2 * s1["loss_tokens"]
    # ... so the parameters end elsewhere than after one pass, and not at the same update taken twice.
    d1 = torch.cat([v.flatten() for v in once.values()])
    d2 = torch.cat([v.flatten() for v in twice.values()])
    assert not torch.allclose(d2, d1, atol=1e-4)
    assert not torch.allclose(d2, 2 * d1, atol=1e-4)


def test_ppo_epochs_must_be_positive() -> None:
    with pytest.raises(Exception, match="train.ppo_epochs"):
        TrainConfig(ppo_epochs=0)
