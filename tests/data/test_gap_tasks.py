"""Synthetic tasks add_gap and shift_gap: split sizes, the out-of-support held-out split, labels, config.

The counts are worked out by hand in the comments; the hash-chosen ones (held-out 361 / 402) are
pinned because the split must never move.
"""

from __future__ import annotations

import random

import pytest

from rollflow.api.config import DatasetConfig, SyntheticTaskConfig
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config
from rollflow.data import load_prompts
from rollflow.data.synthetic import synthetic_rows, task_module
from rollflow.data.tasks import add_gap, add_habit, shift_gap
from rollflow.models.tokenizer import CHARACTERS
from rollflow.rewards.synthetic import synthetic_reward_fn


def test_add_gap_problems() -> None:
    p = add_gap.GapAdditionProblem(45, 12)
    assert (p.text, p.answer, p.in_gap) == ("45+12=", "57", True)
    assert add_gap.GapAdditionProblem(12, 59).in_gap  # the second operand counts too
    assert not add_gap.GapAdditionProblem(39, 60).in_gap  # 39 and 60 border the gap
    assert add_gap.GapAdditionProblem(39, 60).answer == "99"


def test_add_gap_split_sizes_and_support() -> None:
    train, test = add_gap.problem_pool("train"), add_gap.problem_pool("test")
    support = add_gap.warm_start_pool()
    # Outside the gap both operands are in 10..39 or 60..89: 30 * 30 = 900 with both below 40,
    # plus a in 60..89 with b <= 99 - a: 30 + 29 + ... + 1 = 465, and as many the other way round.
    assert len(support) == 900 + 2 * 465 == 1830
    assert len(train) + len(test) == 3240  # add_habit's pool: a, b >= 10, a + b <= 99
    assert (len(train), len(test)) == (2879, 361)  # ~1/4 of the 1,410 gap problems held out
    assert sum(p.in_gap for p in train) == 1410 - 361 == 1049
    # Out of support: every held-out problem is a gap problem, which the warm start never sees.
    assert all(p.in_gap for p in test)
    assert not any(p.in_gap for p in support)
    assert set(support) <= set(train) and not set(support) & set(test)
    assert all(add_gap.is_held_out(p) for p in test) and not any(add_gap.is_held_out(p) for p in train)


def test_shift_gap_problems_and_words() -> None:
    assert shift_gap.ShiftProblem("abc", 3).answer == "def"
    assert shift_gap.ShiftProblem("pop", 9).answer == "yxy"  # p + 9 = y, o + 9 = x: no wrap needed
    p = shift_gap.ShiftProblem("ab", 4)
    assert (p.text, p.answer, p.in_gap) == ("ab+4=", "ef", True)
    words = shift_gap.words()
    assert len(words) == len(set(words)) == 256 + 300 + 300
    assert [sum(len(w) == n for w in words) for n in (2, 3, 4)] == [256, 300, 300]
    assert all(set(w) <= set(shift_gap.LETTERS) for w in words)


def test_shift_gap_split_sizes_and_support() -> None:
    train, test = shift_gap.problem_pool("train"), shift_gap.problem_pool("test")
    support = shift_gap.warm_start_pool()
    assert len(train) + len(test) == 856 * 9 == 7704
    assert len(support) == 856 * 7 == 5992  # shifts 1-3 and 6-9
    assert (len(train), len(test)) == (7302, 402)  # ~1/4 of the 856 * 2 = 1,712 gap problems
    assert sum(p.in_gap for p in train) == 1712 - 402 == 1310
    assert {p.k for p in test} == {4, 5}
    assert {p.k for p in support} == {1, 2, 3, 6, 7, 8, 9}
    assert set(support) <= set(train) and not set(support) & set(test)
    # Every word of the held-out split was seen by the warm start, under other shifts only.
    assert {p.word for p in test} <= {p.word for p in support}


@pytest.mark.parametrize("task", [add_gap, shift_gap])
def test_every_character_is_in_the_tokenizer(task) -> None:  # type: ignore[no-untyped-def]
    chars = {c for split in ("train", "test") for p in task.problem_pool(split) for c in p.text + p.answer}
    assert chars <= set(CHARACTERS)
    assert max(len(p.answer) for p in task.problem_pool("train")) == task.MAX_ANSWER_CHARS


@pytest.mark.parametrize("task", [add_gap, shift_gap])
def test_warm_start_labels_are_always_right(task) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(0)
    problems = task.warm_start_pool()[:50]
    assert all(task.warm_start_label(p, rng, 0.0) == p.answer for p in problems)


def test_rows_draws_and_the_loader() -> None:
    cfg = DatasetConfig(synthetic=SyntheticTaskConfig(task="add_gap", n_train=100, n_eval=50, seed=3))
    test = load_prompts(cfg, cfg.eval_split)
    train = load_prompts(cfg, "train")
    assert (len(train), len(test)) == (100, 50)
    assert all(r["out_of_support"] for r in test)
    assert not {r["prompt_id"] for r in train} & {r["prompt_id"] for r in test}
    row = test[0]
    assert set(row) == {"prompt_id", "messages", "answer", "out_of_support"}
    a, b = row["messages"][0]["content"].rstrip("=").split("+")
    assert row["answer"] == str(int(a) + int(b)) and row["prompt_id"] == f"synthetic-add_gap-test-{a}+{b}"
    assert synthetic_reward_fn(row["messages"][0]["content"], row["answer"], row["answer"]) == 1.0
    # Deterministic, and the eval draw does not depend on n_train.
    again = SyntheticTaskConfig(task="add_gap", n_train=7, n_eval=50, seed=3)
    assert synthetic_rows(again, "test") == test
    shift = synthetic_rows(SyntheticTaskConfig(task="shift_gap", n_eval=20), "test")
    assert shift[0]["prompt_id"].startswith("synthetic-shift_gap-test-")
    assert all(r["out_of_support"] for r in shift)
    with pytest.raises(ValueError, match="between 1 and 361"):
        add_gap.sample_problems("test", 362, seed=1)


def test_task_selection_and_config_errors() -> None:
    assert task_module("add_habit") is add_habit
    assert task_module("add_gap") is add_gap and task_module("shift_gap") is shift_gap
    with pytest.raises(ValueError, match="unknown synthetic task 'add'"):
        task_module("add")
    with pytest.raises(ConfigError, match="dataset.synthetic.task"):
        SyntheticTaskConfig(task="sub_gap")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be one of 'add_habit', 'add_gap', 'shift_gap'"):
        load_config(overrides=["dataset.synthetic.task=addgap"])
    assert load_config(overrides=["dataset.synthetic.task=shift_gap"]).dataset.synthetic.task == "shift_gap"


@pytest.mark.parametrize(
    ("path", "task"), [("configs/tiny_hard.yaml", "add_gap"), ("configs/tiny_hard2.yaml", "shift_gap")]
)
def test_hard_configs_name_their_task(path: str, task: str) -> None:
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[2] / path)
    assert cfg.dataset.kind == "synthetic" and cfg.dataset.synthetic.task == task
    assert cfg.model.bootstrap_tiny and task in cfg.model.path  # not the add_habit model's directory
