"""The synthetic verifiable task of the embedded default: two-digit addition, mostly with a carry.

What it is. A problem is ``a+b=`` with ``a, b`` in [10, 99], sent as one user chat turn; the reference
answer is ``str(a + b)`` and the completion must be exactly that number (``rollflow.rewards.synthetic``).
This module fixes three things:

* **The held-out split.** A problem is held out iff the first byte of ``sha256("a+b=")`` is below 32,
  i.e. a fixed ~1/8 of the 8,100 problems (1,014 of them: 446 with a carry), chosen by the problem text alone. No seed,
  size or config value can move a problem between the splits, so neither the train prompts nor the
  tiny model's warm start (``rollflow.models.bootstrap``) ever see an eval problem.
* **The prompt mix.** A fraction ``carry_fraction`` (default 0.85) of the prompts of either split
  needs a carry (the units digits sum to 10 or more); the rest do not.
* **The warm-start labels.** The tiny model is trained to answer correctly with probability
  ``p_correct`` (default 0.25) and otherwise with the "forgot the carry" answer ``a + b - 10``.
  Without a carry the two coincide, so those labels are always right.

Why this task (the demo stands on it). After the warm start the model knows both the sum and the
bias, so on carry problems it puts about ``p_correct`` of its mass on the right tens digit:

    greedy accuracy  ~ 1 - carry_fraction        (it is right only where no carry is needed) ~ 0.15
    sampled accuracy ~ (1 - carry_fraction) + carry_fraction * p_correct                  ~ 0.36
    pass@8 on a carry problem ~ 1 - (1 - p_correct)^8                                     ~ 0.90

so GRPO groups of 8 almost always hold a right and a wrong answer, and the one thing RL has to learn
is a single systematic behaviour (carry) that transfers to held-out problems. ``bench/task_check.py``
measures all of this, including a minimal REINFORCE loop that climbs past 0.8 greedy accuracy.

What it is not: a loader (``rollflow.data.loader.load_prompts`` calls ``synthetic_rows``) or a reward.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from rollflow.api.config import SyntheticTaskConfig

Split = Literal["train", "test"]

LOW, HIGH = 10, 99  # operand range, inclusive
DEFAULT_CARRY_FRACTION = 0.85
DEFAULT_P_CORRECT = 0.25
_HELD_OUT_BYTE_BELOW = 32  # sha256 first byte < 32  <=>  held out (32/256 = 1/8)


@dataclass(frozen=True)
class AdditionProblem:
    """``a+b=``; ``answer`` is the true sum, ``distractor`` the sum with the carry forgotten."""

    a: int
    b: int

    @property
    def text(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def needs_carry(self) -> bool:
        return self.a % 10 + self.b % 10 >= 10

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def distractor(self) -> str:
        """What a model that forgets the carry from the units says: ``a + b - 10`` (or the sum)."""
        return str(self.a + self.b - 10 * self.needs_carry)


def is_held_out(problem: AdditionProblem) -> bool:
    """Fixed membership of the held-out (eval) split, from the problem text only."""
    return hashlib.sha256(problem.text.encode("ascii")).digest()[0] < _HELD_OUT_BYTE_BELOW


@cache
def problem_pool(split: Split) -> tuple[tuple[AdditionProblem, ...], tuple[AdditionProblem, ...]]:
    """All problems of a split as ``(with_carry, without_carry)``, in a fixed order."""
    if split not in ("train", "test"):
        raise ValueError(f"synthetic split must be 'train' or 'test', got {split!r}")
    want_held_out = split == "test"
    carry: list[AdditionProblem] = []
    plain: list[AdditionProblem] = []
    for a in range(LOW, HIGH + 1):
        for b in range(LOW, HIGH + 1):
            p = AdditionProblem(a, b)
            if is_held_out(p) == want_held_out:
                (carry if p.needs_carry else plain).append(p)
    return tuple(carry), tuple(plain)


def sample_problems(
    split: Split, n: int, *, seed: int, carry_fraction: float = DEFAULT_CARRY_FRACTION
) -> list[AdditionProblem]:
    """``n`` distinct problems of ``split``: ``round(n * carry_fraction)`` with a carry, the rest without.

    Deterministic for ``(split, n, seed, carry_fraction)``; the order is shuffled.

    Raises:
        ValueError: the split does not hold enough problems of either kind; the message says how many.
    """
    if not 0.0 <= carry_fraction <= 1.0:
        raise ValueError(f"carry_fraction must be in [0, 1], got {carry_fraction}")
    carry, plain = problem_pool(split)
    n_carry = round(n * carry_fraction)
    n_plain = n - n_carry
    if n_carry > len(carry) or n_plain > len(plain):
        raise ValueError(
            f"the synthetic {split!r} split has {len(carry)} carry and {len(plain)} no-carry problems, "
            f"but {n} prompts at carry_fraction={carry_fraction} need {n_carry} and {n_plain}; lower "
            f"dataset.synthetic.n_{'train' if split == 'train' else 'eval'} or change carry_fraction"
        )
    # One stream per split, so n_train never changes which eval problems are drawn and vice versa.
    rng = random.Random(f"rollflow-synthetic:{split}:{seed}")
    chosen = rng.sample(carry, n_carry) + rng.sample(plain, n_plain)
    rng.shuffle(chosen)
    return chosen


def warm_start_label(problem: AdditionProblem, rng: random.Random, p_correct: float) -> str:
    """The warm-start target: the true sum with probability ``p_correct``, else the distractor."""
    return problem.answer if rng.random() < p_correct else problem.distractor


def problem_row(problem: AdditionProblem, split: Split) -> dict[str, Any]:
    """A dataset row in the loader's format (see ``rollflow.data.loader``)."""
    return {
        "prompt_id": f"synthetic-{split}-{problem.a}+{problem.b}",
        "messages": [{"role": "user", "content": problem.text}],
        "answer": problem.answer,
        "needs_carry": problem.needs_carry,
    }


def synthetic_rows(cfg: SyntheticTaskConfig, split: Split) -> list[dict[str, Any]]:
    """The prompt set of a split: ``cfg.n_train`` train or ``cfg.n_eval`` held-out rows."""
    n = cfg.n_train if split == "train" else cfg.n_eval
    problems = sample_problems(split, n, seed=cfg.seed, carry_fraction=cfg.carry_fraction)
    return [problem_row(p, split) for p in problems]
