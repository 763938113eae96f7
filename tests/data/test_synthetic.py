"""The synthetic task: a fixed held-out split, deterministic prompt sets, the carry mix, the labels."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rollflow.api.config import DatasetConfig, SyntheticTaskConfig
from rollflow.data import load_prompts
from rollflow.data.synthetic import (
    AdditionProblem,
    is_held_out,
    problem_pool,
    sample_problems,
    synthetic_rows,
    warm_start_label,
)
from rollflow.rewards.synthetic import synthetic_reward_fn


def test_problem_arithmetic() -> None:
    carry = AdditionProblem(17, 25)  # 7 + 5 = 12 >= 10: a carry into the tens
    assert (carry.text, carry.answer, carry.distractor, carry.needs_carry) == ("17+25=", "42", "32", True)
    plain = AdditionProblem(12, 35)  # 2 + 5 = 7: no carry, the distractor is the answer
    assert (plain.answer, plain.distractor, plain.needs_carry) == ("47", "47", False)
    big = AdditionProblem(57, 68)  # 125; forgetting the units carry gives 115
    assert (big.answer, big.distractor) == ("125", "115")


def test_the_held_out_split_is_fixed_and_disjoint() -> None:
    train = set(problem_pool("train")[0] + problem_pool("train")[1])
    test = set(problem_pool("test")[0] + problem_pool("test")[1])
    assert not train & test
    assert len(train) + len(test) == 90 * 90  # every a, b in [10, 99]
    # The sizes quoted in the config help text: 446 + 568 held out, 3199 + 3887 train.
    assert (len(problem_pool("test")[0]), len(problem_pool("test")[1])) == (446, 568)
    assert (len(problem_pool("train")[0]), len(problem_pool("train")[1])) == (3199, 3887)
    assert all(is_held_out(p) for p in test)


def test_prompt_sets_are_deterministic_and_follow_the_carry_fraction() -> None:
    a = sample_problems("train", 200, seed=7)
    assert a == sample_problems("train", 200, seed=7)
    assert a != sample_problems("train", 200, seed=8)
    assert len(set(a)) == 200
    assert sum(p.needs_carry for p in a) == 170  # round(200 * 0.85)
    assert sum(p.needs_carry for p in sample_problems("test", 100, seed=7, carry_fraction=0.5)) == 50


def test_a_split_too_small_for_the_request_says_what_to_change() -> None:
    with pytest.raises(ValueError, match="446 carry .* lower dataset.synthetic.n_eval"):
        sample_problems("test", 600, seed=1)  # 510 carry problems wanted, 446 exist
    with pytest.raises(ValueError, match="must be 'train' or 'test'"):
        problem_pool("eval")  # type: ignore[arg-type]


def test_warm_start_labels_mix_the_answer_and_the_distractor() -> None:
    rng = random.Random(0)
    p = AdditionProblem(17, 25)
    counts = Counter(warm_start_label(p, rng, 0.25) for _ in range(4000))
    assert set(counts) == {"42", "32"}
    assert abs(counts["42"] / 4000 - 0.25) < 0.03  # binomial sd = sqrt(.25*.75/4000) = 0.007
    assert {warm_start_label(AdditionProblem(12, 35), rng, 0.25) for _ in range(50)} == {"47"}


def test_rows_and_the_loader() -> None:
    cfg = DatasetConfig(synthetic=SyntheticTaskConfig(n_train=40, n_eval=20, seed=3))
    train = load_prompts(cfg, "train")
    test = load_prompts(cfg, cfg.eval_split)
    assert len(train) == 40 and len(test) == 20
    assert train == synthetic_rows(cfg.synthetic, "train")
    row = test[0]
    assert set(row) == {"prompt_id", "messages", "answer", "needs_carry"}
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
