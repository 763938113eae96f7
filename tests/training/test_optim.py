"""Warmup + constant/cosine schedule (hand-worked) and AdamW parameter groups."""

from __future__ import annotations

import pytest
import torch

from rollflow.training.optim import build_optimizer, build_scheduler, lr_factor


def test_warmup_then_constant() -> None:
    # W = 4: f = 1/4, 2/4, 3/4, 4/4, then 1
    f = [lr_factor(s, warmup_steps=4, total_steps=10, schedule="constant") for s in range(6)]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_hand_worked() -> None:
    # W = 2, S = 10, m = 0.1: s = 2 -> p 0 -> 1.0; s = 6 -> p = 4/8 = .5 -> .1 + .9 * .5 = 0.55;
    # s = 10 -> p = 1 -> 0.1; beyond S stays at m
    kw = dict(warmup_steps=2, total_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, **kw) == pytest.approx(0.5)
    assert lr_factor(2, **kw) == pytest.approx(1.0)
    assert lr_factor(6, **kw) == pytest.approx(0.55)
    assert lr_factor(10, **kw) == pytest.approx(0.1)
    assert lr_factor(20, **kw) == pytest.approx(0.1)


def test_scheduler_drives_optimizer_lr() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 2))
    opt = build_optimizer([("w", p)], lr=1.0)
    sched = build_scheduler(opt, warmup_steps=2, total_steps=4, schedule="cosine")
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # 1/2, 2/2, then p = 0 -> 1, p = 1/2 -> 0.5
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_no_weight_decay_on_vectors() -> None:
    m = torch.nn.Linear(3, 2)
    opt = build_optimizer(m.named_parameters(), lr=1e-3, weight_decay=0.1)
    by_decay = {g["weight_decay"]: [tuple(p.shape) for p in g["params"]] for g in opt.param_groups}
    assert by_decay == {0.1: [(2, 3)], 0.0: [(2,)]}
