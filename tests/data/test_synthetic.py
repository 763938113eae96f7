"""Synthetic task add_habit: a fixed held-out split, deterministic prompt sets, the off-by-one labels."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rollflow.api.config import DatasetConfig, SyntheticTaskConfig
from rollflow.data import load_prompts
from rollflow.data.synthetic import synthetic_rows
from rollflow.data.tasks.add_habit import (
    AdditionProblem,
    is_held_out,
    problem_pool,
    sample_problems,
    warm_start_label,
    warm_start_pool,
)
from rollflow.rewards.synthetic import synthetic_reward_fn


def test_problem_arithmetic() -> None:
    p = AdditionProblem(17, 25)
    assert (p.text, p.answer, p.distractor, p.round_operand) == ("17+25=", "42", "43", False)
    assert AdditionProblem(45, 54).distractor == "100"  # 99 + 1: the habit can carry into the hundreds
    r = AdditionProblem(30, 47)  # a multiple of ten: no habit, the distractor is the answer
    assert (r.answer, r.distractor, r.round_operand) == ("77", "77", True)
    assert AdditionProblem(47, 90).round_operand


def test_the_held_out_split_is_fixed_and_disjoint() -> None:
    train, test = set(problem_pool("train")), set(problem_pool("test"))
    assert not train & test
    # a, b >= 10 and a + b <= 99: for a = 10..89 there are 90 - a values of b, 80 + 79 + ... + 1 = 3240.
    assert len(train) + len(test) == 3240
    assert all(p.a >= 10 and p.b >= 10 and p.a + p.b <= 99 for p in train | test)
    assert (len(train), len(test)) == (2809, 431)  # sha256 first byte < 32: about 1/8 held out
    assert sum(p.round_operand for p in test) == 79  # 18%, like the 605/2809 (22%) of train
    assert all(is_held_out(p) for p in test) and not any(is_held_out(p) for p in train)
    assert warm_start_pool() == problem_pool("train")  # the warm start sees every train problem


def test_prompt_sets_are_deterministic_and_distinct() -> None:
    a = sample_problems("test", 200, seed=7)
    assert a == sample_problems("test", 200, seed=7)
    assert a != sample_problems("test", 200, seed=8)
    assert len(set(a)) == 200
    # The eval draw does not depend on n_train (one random stream per split).
    assert sample_problems("test", 50, seed=7) == sample_problems("test", 50, seed=7)
    with pytest.raises(ValueError, match="between 1 and 431"):
        sample_problems("test", 432, seed=1)
    with pytest.raises(ValueError, match="must be 'train' or 'test'"):
        problem_pool("eval")  # type: ignore[arg-type]


def test_warm_start_labels_mix_the_answer_and_the_distractor() -> None:
    rng = random.Random(0)
    counts = Counter(warm_start_label(AdditionProblem(17, 25), rng, 0.2) for _ in range(4000))
    assert set(counts) == {"42", "43"}
    assert abs(counts["42"] / 4000 - 0.2) < 0.03  # binomial sd = sqrt(.2*.8/4000) = 0.006
    assert {warm_start_label(AdditionProblem(30, 47), rng, 0.2) for _ in range(50)} == {"77"}


def test_default_sets() -> None:
    cfg = SyntheticTaskConfig()
    assert cfg.task == "add_habit"  # the fast smoke test stays the default
    train, test = synthetic_rows(cfg, "train"), synthetic_rows(cfg, "test")
    assert (len(train), len(test)) == (2000, 200)
    share = sum(r["round_operand"] for r in test) / 200
    assert 0.10 < share < 0.28  # ~0.18; the greedy starting accuracy is about this share


def test_rows_and_the_loader() -> None:
    cfg = DatasetConfig(synthetic=SyntheticTaskConfig(n_train=40, n_eval=20, seed=3))
    train = load_prompts(cfg, "train")
    test = load_prompts(cfg, cfg.eval_split)
    assert len(train) == 40 and len(test) == 20
    assert train == synthetic_rows(cfg.synthetic, "train")
    row = test[0]
    assert set(row) == {"prompt_id", "messages", "answer", "round_operand"}
    a, b = row["messages"][0]["content"].rstrip("=").split("+")
    assert row["answer"] == str(int(a) + int(b))
    assert row["prompt_id"] == f"synthetic-test-{a}+{b}"
    assert synthetic_reward_fn(row["messages"][0]["content"], row["answer"], row["answer"]) == 1.0
    assert not {r["prompt_id"] for r in train} & {r["prompt_id"] for r in test}


def test_loader_options_apply_to_the_synthetic_task() -> None:
    cfg = DatasetConfig(
        system_prompt="Add.", max_rows=5, synthetic=SyntheticTaskConfig(n_train=40, n_eval=20)
    )
    rows = load_prompts(cfg, "train")
    assert len(rows) == 5
    assert rows[0]["messages"][0] == {"role": "system", "content": "Add."}
    assert rows[0]["messages"][1]["role"] == "user"
    with pytest.raises(ValueError, match="neither"):
        load_prompts(cfg, "validation-2")
