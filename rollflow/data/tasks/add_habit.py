"""Synthetic task ``add_habit``: two-digit addition with an off-by-one habit (the fast smoke test).

What it is. A problem is ``a+b=`` with ``a, b >= 10`` and ``a + b <= 99`` (3,240 problems, all with
two-digit answers), sent as one user chat turn; the reference answer is ``str(a + b)`` and the
completion must be exactly that number (``rollflow.rewards.synthetic``). This module fixes three things:

* **The held-out split.** A problem is held out iff the first byte of ``sha256("a+b=")`` is below 32,
  i.e. a fixed ~1/8 of the problems (431 of them; 2,809 train), chosen by the problem text alone.
  No seed, size or config value can move a problem between the splits, so neither the train prompts
  nor the tiny model's warm start (``rollflow.models.bootstrap``) ever see an eval problem.
* **The prompt sets.** Uniform draws without replacement from a split (``n_train`` / ``n_eval``).
  About 20% of the problems have a *round* operand (a multiple of ten: ``30+47=``).
* **The warm-start labels.** The tiny model first learns the sum from right answers only, then is
  trained to answer ``a + b`` with probability ``p_correct`` (default 0.2) and otherwise
  ``a + b + 1``, except on problems with a round operand, whose labels stay right.

Why this task (the demo stands on it). After the warm start the model knows the sum and has the
habit, so where the habit applies it puts about ``p_correct`` of its mass on the right answer:

    greedy held-out accuracy ~ share of round-operand problems (the only ones it gets right) ~ 0.2
    sampled accuracy with the habit ~ p_correct                                              ~ 0.2
    pass@8 with the habit ~ 1 - (1 - p_correct)^8                                            ~ 0.83

so most GRPO groups of 8 hold a right and a wrong answer, and what RL has to learn is one
systematic behaviour - drop the +1 - that transfers to held-out problems. The habit is the
"answer + 1" kind on purpose: the policy only ever chooses between ``s`` and ``s + 1``, so the
cheapest move GRPO can make (prefer ``s`` everywhere) is also the right one everywhere. A
"forgot the carry" habit was tried first and fails that test: GRPO learns "always carry", which
breaks the no-carry problems, and once their groups are all wrong nothing pulls it back (measured:
held-out greedy stuck at 0.84). Sums stay below 100 because two-digit answers are learnt in the
warm-start budget; ``bench/task_check.py`` measures all of this with a minimal GRPO loop.

What it is not: a loader (``rollflow.data.loader.load_prompts`` calls ``synthetic_rows``) or a reward.
Nor a test of generalisation: for that see ``add_gap`` and ``shift_gap`` in this package.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from rollflow.data.tasks import Split, SumProblem, check_split, draw, hash_byte

LOW, HIGH = 10, 99  # operand range, inclusive
MAX_SUM = 99  # two-digit answers only
MAX_ANSWER_CHARS = 3  # the distractor of 45+54= is "100"
# Below this the sum is not learnt for every seed (seed 1 at 300 steps: held-out sampled accuracy 0.10,
# pass@8 0.58, round-operand problems 12% right), and RL would have to learn arithmetic, not the habit.
MIN_WARM_START_STEPS = 500
warm_start_example = None  # trained on prompt + label (the SyntheticTask protocol's optional hooks)
warm_start_probe = None
DEFAULT_P_CORRECT = 0.2
_HELD_OUT_BYTE_BELOW = 32  # sha256 first byte < 32  <=>  held out (32/256 = 1/8)


@dataclass(frozen=True)
class AdditionProblem(SumProblem):
    """``a+b=``: ``answer`` is the true sum, ``distractor`` what the off-by-one habit says."""

    @property
    def round_operand(self) -> bool:
        """An operand is a multiple of ten: the warm-started model has no habit here."""
        return self.a % 10 == 0 or self.b % 10 == 0

    @property
    def distractor(self) -> str:
        """``a + b + 1``, or the sum itself for a round operand."""
        return self.answer if self.round_operand else str(self.a + self.b + 1)


def is_held_out(problem: AdditionProblem) -> bool:
    """Fixed membership of the held-out (eval) split, from the problem text only."""
    return hash_byte(problem.text) < _HELD_OUT_BYTE_BELOW


@cache
def problem_pool(split: Split) -> tuple[AdditionProblem, ...]:
    """All problems of a split in a fixed order (2,809 train, 431 test)."""
    check_split(split)
    want_held_out = split == "test"
    return tuple(
        p
        for a in range(LOW, HIGH + 1)
        for b in range(LOW, min(HIGH, MAX_SUM - a) + 1)
        if is_held_out(p := AdditionProblem(a, b)) == want_held_out
    )


def sample_problems(split: Split, n: int, *, seed: int) -> list[AdditionProblem]:
    """``n`` distinct problems of ``split`` in random order; deterministic for ``(split, n, seed)``.

    Raises:
        ValueError: the split holds fewer than ``n`` problems; the message says which setting to lower.
    """
    # One stream per split, so n_train never changes which eval problems are drawn and vice versa.
    return draw(problem_pool(split), n, split=split, stream=f"rollflow-synthetic:{split}:{seed}")


def warm_start_pool() -> tuple[AdditionProblem, ...]:
    """What the warm start trains on: every train problem (the habit, not the support, is the point)."""
    return problem_pool("train")


def warm_start_label(problem: AdditionProblem, rng: random.Random, p_correct: float) -> str:
    """The warm-start target: the true sum with probability ``p_correct``, else the distractor."""
    return problem.answer if rng.random() < p_correct else problem.distractor


def problem_row(problem: AdditionProblem, split: Split) -> dict[str, Any]:
    """A dataset row in the loader's format (see ``rollflow.data.loader``)."""
    return {
        "prompt_id": f"synthetic-{split}-{problem.a}+{problem.b}",
        "messages": [{"role": "user", "content": problem.text}],
        "answer": problem.answer,
        "round_operand": problem.round_operand,
    }
