"""Synthetic task ``add_gap``: two-digit addition where the warm start never saw an operand in 40-59.

What it is. The problems are those of ``add_habit`` - ``a+b=`` with ``a, b >= 10`` and ``a + b <= 99``
(3,240 problems, two-digit answers), reference ``str(a + b)``, exact match - split by *support*:

* **Gap problems**: an operand in 40..59 (tens digit 4 or 5): 1,410 problems. The warm start
  (``rollflow.models.bootstrap``) never sees one; it learns the sum on the other 1,830 problems,
  with right labels only (no planted habit).
* **The held-out split**: the gap problems whose ``sha256(text)`` first byte is below 64 (~1/4),
  361 problems. Every held-out problem is outside the warm start's support.
* **The train split** (the RL prompts): everything else - the 1,830 problems the warm start knew
  plus the other 1,049 gap problems, 2,879 in all (36% gap).

Why this task. The tiny model learns the digit sums as a table shared between positions, and it
interpolates well over one unseen tens digit (measured: a first operand in the 50s never seen ->
held-out greedy 1.0) but not over two: with 4 and 5 unseen as tens digits of either operand, the
base policy is mostly wrong on gap problems while still sure of the rest. So most GRPO groups are
all right (known problems) or all wrong (gap problems it cannot do), the few mixed groups on gap
problems carry the signal, and what RL learns on train gap problems must transfer to held-out ones
with other operands - generalisation, not the removal of a planted habit. Measured with
``python -m bench.task_check --task add_gap`` (1 thread, 1,000 warm-start steps, GRPO 16 x 8,
lr 1e-4; ``bench/results/task_check_add_gap.json``):

    (measurement in progress; see the JSON file)

Wider gaps (tens digits 4-6) leave almost nothing to sample (pass@8 0.02-0.12: RL has no signal);
a gap in the first operand only (4-5) starts too high (~0.6); sums past 99 or operand ranges
beyond the warm start's (an extrapolation) start at 0.0 and pass@8 0.0.

What it is not: a loader (``rollflow.data.synthetic.synthetic_rows`` draws the prompt sets) or a reward.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from rollflow.data.tasks import Split, SumProblem, check_split, draw, hash_byte

NAME = "add_gap"
LOW, HIGH, MAX_SUM = 10, 99, 99  # as add_habit: a, b >= 10, two-digit sums
GAP_TENS = (4, 5)  # an operand in 40..59 is outside the warm start's support
MAX_ANSWER_CHARS = 2
# The support is learnt in a jump whose time varies with the seed: at 500 steps (batch 64) seed 1 of
# the warm start ends at loss 0.12 (support greedy 0.94, sampling unsure), at 800 at 0.03; at 1,000
# seeds 1-3 all end below 0.001 with support greedy 1.0 (~90 s on one thread).
MIN_WARM_START_STEPS = 1000
warm_start_example = None  # trained on prompt + label (the SyntheticTask protocol's optional hooks)
warm_start_probe = None
_HELD_OUT_BYTE_BELOW = 64  # of the gap problems, sha256 first byte < 64 (1/4) is held out


@dataclass(frozen=True)
class GapAdditionProblem(SumProblem):
    """``a+b=`` with the true sum as answer, and whether an operand lies in the gap."""

    @property
    def in_gap(self) -> bool:
        """An operand in 40..59: the warm start never sees this problem or any like it."""
        return self.a // 10 in GAP_TENS or self.b // 10 in GAP_TENS


def is_held_out(problem: GapAdditionProblem) -> bool:
    """Fixed membership of the held-out split: a gap problem whose text hashes below 64."""
    return problem.in_gap and hash_byte(problem.text) < _HELD_OUT_BYTE_BELOW


@cache
def problem_pool(split: Split) -> tuple[GapAdditionProblem, ...]:
    """All problems of a split in a fixed order (2,879 train, 361 test)."""
    check_split(split)
    want_held_out = split == "test"
    return tuple(
        p
        for a in range(LOW, HIGH + 1)
        for b in range(LOW, min(HIGH, MAX_SUM - a) + 1)
        if is_held_out(p := GapAdditionProblem(a, b)) == want_held_out
    )


@cache
def warm_start_pool() -> tuple[GapAdditionProblem, ...]:
    """The warm start's support: the 1,830 problems without an operand in 40..59."""
    return tuple(p for p in problem_pool("train") if not p.in_gap)


def sample_problems(split: Split, n: int, *, seed: int) -> list[GapAdditionProblem]:
    """``n`` distinct problems of ``split`` in random order; deterministic for ``(split, n, seed)``."""
    return draw(problem_pool(split), n, split=split, stream=f"rollflow-synthetic:{NAME}:{split}:{seed}")


def warm_start_label(problem: GapAdditionProblem, rng: random.Random, p_correct: float) -> str:
    """Always the true sum (no habit): ``rng`` and ``p_correct`` are unused."""
    del rng, p_correct
    return problem.answer


def problem_row(problem: GapAdditionProblem, split: Split) -> dict[str, Any]:
    """A dataset row in the loader's format; ``out_of_support`` marks a gap problem."""
    return {
        "prompt_id": f"synthetic-{NAME}-{split}-{problem.a}+{problem.b}",
        "messages": [{"role": "user", "content": problem.text}],
        "answer": problem.answer,
        "out_of_support": problem.in_gap,
    }
