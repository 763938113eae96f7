"""train.proximal: approx (A-3PO): the interpolation's numbers by hand, one forward fewer per micro-batch,
the forward mode's update wherever the approximation is exact, and a short run that trains."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_group, write_groups
from safetensors.torch import load_file
from test_trainer import make_cfg, published_weights
from transformers import AutoModelForCausalLM

from rollflow.api.config import TrainConfig
from rollflow.api.config.train import WarmStartConfig
from rollflow.api.errors import ConfigError
from rollflow.api.metrics import InMemorySink
from rollflow.training.actor import PolicyActor
from rollflow.training.batching import build_batch
from rollflow.training.distributed import DistContext
from rollflow.training.microbatch import plan_step
from rollflow.training.proximal import approx_proximal_logp, weights_version
from rollflow.training.trainer import Trainer


def test_interpolation_by_hand() -> None:
    behav = torch.tensor([[-2.0, -2.0, -2.0, -3.0, 0.0]])  # [1, 5]
    logp = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -5.0]], requires_grad=True)  # [1, 5]
    versions = torch.tensor([[2, 4, 3, 0, -1]])  # [1, 5]; -1: a prompt token
    # V = 4, U = 2 updates a step, u = 1 applied: v_c = 4 + 1/2 = 4.5
    v_c = weights_version(4, 1, 2)
    assert v_c == 4.5
    prox = approx_proximal_logp(behav, logp, versions, proximal_version=4, current_version=v_c)
    expected = torch.tensor([[
        -2.0 + (2 / 2.5) * 1.0,  # v_b 2: alpha = (4 - 2) / (4.5 - 2) = 0.8 -> -1.2
        -2.0,  # v_b 4 = V, on-policy: alpha 0, the behaviour logprob
        -2.0 + (1 / 1.5) * 1.0,  # v_b 3: alpha = 1 / 1.5 = 2/3 -> -1.3333
        -3.0 + (4 / 4.5) * 2.0,  # v_b 0: alpha = 4 / 4.5 = 0.8889 -> -1.2222
        0.0,  # no version: the behaviour value, whatever the current logp
    ]])  # fmt: skip
    torch.testing.assert_close(prox, expected)
    assert prox[0, 0].item() == pytest.approx(-1.2) and not prox.requires_grad  # detached
    # u = 0 (first update of the step): v_c = V, alpha = 1 behind V -> exactly the current logprob
    first = approx_proximal_logp(
        behav, logp, versions, proximal_version=4, current_version=weights_version(4, 0, 2)
    )
    assert first.tolist() == [[-1.0, -2.0, -1.0, -1.0, 0.0]]
    with pytest.raises(ValueError, match="before proximal_version"):
        approx_proximal_logp(behav, logp, versions, proximal_version=4, current_version=3.5)
    with pytest.raises(ValueError, match="updates_per_step"):
        weights_version(4, 3, 2)


def test_approx_is_opt_in_and_refuses_what_it_cannot_place() -> None:
    assert TrainConfig().proximal == "forward"
    with pytest.raises(ConfigError, match="train.proximal.*use_decoupled_loss"):
        TrainConfig(proximal="approx", use_decoupled_loss=False)
    with pytest.raises(ConfigError, match="train.proximal.*warm_start_from"):
        TrainConfig(proximal="approx", warm_start_from=WarmStartConfig(trial="older"))


V = 5  # the trainer's version in the actor-level updates below


def _update(model_dir: Path, proximal: str, *, behind: int, n_mb: int = 1, on_policy: bool = False) -> tuple:
    """One step's update at version V on groups sampled ``behind`` versions ago; (weights, metrics)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = TrainConfig(batch_size=3, ppo_n_minibatches=n_mb, grad_clip=0.0, proximal=proximal)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    actor = PolicyActor(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), DistContext(), cfg)
    batch = build_batch([make_group(f"g{i}", n=3, version=V - behind) for i in range(3)])
    plans = plan_step([g.n_tokens for g in batch.groups], n_minibatches=n_mb, world_size=1, rank=0,
                      max_tokens_per_mb=cfg.max_tokens_per_mb)  # fmt: skip
    if on_policy:  # the server sampled with these very weights: its logprobs are the trainer's
        batch.behav_logp = actor.compute_logp(model, batch, plans)
    if proximal == "forward":
        batch.prox_logp = actor.compute_logp(model, batch, plans)
    batch.advantages = actor.compute_advantages(batch)
    stats = actor.ppo_update(batch, plans, version=V)
    return {k: v.detach().clone() for k, v in model.named_parameters()}, stats


@pytest.mark.parametrize("n_mb", [1, 3])
def test_on_policy_data_gives_exactly_the_forward_loss(tiny_model_dir: Path, n_mb: int) -> None:
    fwd, s_fwd = _update(tiny_model_dir, "forward", behind=0, n_mb=n_mb, on_policy=True)
    app, s_app = _update(tiny_model_dir, "approx", behind=0, n_mb=n_mb, on_policy=True)
    assert s_app["loss"] == s_fwd["loss"] and s_app["behav_weight_mean"] == s_fwd["behav_weight_mean"]
    assert all(torch.equal(app[k], fwd[k]) for k in fwd)


def test_off_policy_with_one_update_a_step_is_the_forward_update(tiny_model_dir: Path) -> None:
    """One minibatch, one pass (the defaults): alpha = 1 on every stale token, the update's own logprobs
    are the proximal ones, so the step equals the forward mode's; with 3 minibatches it approximates."""
    fwd, s_fwd = _update(tiny_model_dir, "forward", behind=2)
    app, s_app = _update(tiny_model_dir, "approx", behind=2)
    assert s_fwd["behav_weight_mean"] != 1.0  # stale tokens: the importance weight is at work
    assert s_app["loss"] == pytest.approx(s_fwd["loss"], abs=1e-7)
    for k in fwd:
        torch.testing.assert_close(app[k], fwd[k], atol=1e-7, rtol=1e-6)
    # 3 minibatches: the 2nd and 3rd are scored at v_c = V + 1/3, V + 2/3, where alpha < 1 is an estimate
    # (it moves the importance weight; the update moves only where the clip or the cap binds, since
    # w * r = exp(logp - behav) whatever the proximal)
    _, s_fwd3 = _update(tiny_model_dir, "forward", behind=2, n_mb=3)
    _, s_app3 = _update(tiny_model_dir, "approx", behind=2, n_mb=3)
    assert math.isfinite(s_app3["loss"]) and s_app3["behav_weight_mean"] != s_fwd3["behav_weight_mean"]


class _CountingTrainer(Trainer):
    """The real Trainer, counting the policy's forward passes."""

    def _setup(self) -> None:
        super()._setup()
        self.forwards = 0

        def count(*_: Any) -> None:
            self.forwards += 1

        self.model.register_forward_hook(count)


def _train(storage: Any, model_dir: Path, proximal: str) -> tuple[int, InMemorySink]:
    """3 steps of 2 minibatches on groups of version 0: stale from the second step on."""
    write_groups(storage, [f"g{i}" for i in range(6)])
    base, trial = storage.base.rsplit("/", 2)[0], storage.base.rsplit("/", 1)[1]
    sink = InMemorySink()
    trainer = _CountingTrainer(
        make_cfg(base, "test", trial, model_dir, proximal=proximal, ppo_n_minibatches=2),
        storage,
        metrics=sink,
    )
    assert trainer.run().final_version == 3
    return trainer.forwards, sink


def test_approx_runs_one_forward_fewer_per_micro_batch_and_trains(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from storage.fs import Storage

    runs = {p: Storage.open(str(tmp_path / p), "test", "t") for p in ("forward", "approx")}
    n_fwd, _ = _train(runs["forward"], tiny_model_dir, "forward")
    n_app, sink = _train(runs["approx"], tiny_model_dir, "approx")
    # forward: a proximal pass and an update pass per micro-batch; approx: the update pass only
    assert n_app >= 3 * 2 and n_fwd == 2 * n_app
    assert all(math.isfinite(x) for x in sink.values("loss"))
    assert sink.values("behav_weight_mean")[1:] != [1.0, 1.0]  # stale tokens get an importance weight
    start, v3 = load_file(str(tiny_model_dir / "model.safetensors")), published_weights(runs["approx"], 3)
    assert start.keys() == v3.keys() and any(not torch.equal(start[k], v3[k]) for k in v3)
