"""Synthetic task ``shift_gap``: shift every letter of a word by ``k``; the warm start never saw k = 4 or 5.

What it is. A problem is ``word+k=`` with a word of 2-4 letters from ``a..p`` and a shift
``k`` in 1..9; the answer is the word with every letter moved ``k`` places up the alphabet
(``"abc+3=" -> "def"``, ``"pop+9=" -> "yxy"``; no wrap-around is needed, ``p + 9 = y``), exact match.
The words are fixed: all 256 of two letters and, of three and four letters, the 300 whose
``sha256`` sorts first - 856 words, each with all nine shifts, 7,704 problems. Split by support:

* **Gap problems**: ``k`` = 4 or 5 (1,712 problems). The warm start (``rollflow.models.bootstrap``)
  trains on the shifts 1-3 and 6-9 only, with right labels, so it has seen every word and every
  letter, but never these two shifts.
* **The held-out split**: the gap problems whose ``sha256(text)`` first byte is below 64 (~1/4),
  402 problems, all outside the warm start's support.
* **The train split** (the RL prompts): the other 7,302 problems, the 1,310 remaining
  gap problems among them.

Why this task. It is not addition: the answer is a string, as long as the word, and every letter of it
must be right. The model learns a letter-plus-shift table shared by all positions and interpolates
the two unseen shifts between 3 and 6 only in part, so on gap problems it is mostly wrong and
rarely right, while the known shifts are right: GRPO's signal comes from a minority of groups,
and what it learns on train gap problems (the shifts 4 and 5 of *some* words) must carry over to
held-out words. Measured (2026-11-24, 1,000 warm-start steps, seed 1): greedy accuracy on the held-out
split 0.000; in a 300-second ``bench.peer`` race on 2 cores (one seed per system) TRL's GRPOTrainer reached
0.005 and rollflow 0.020. At that budget the family gives almost no signal; it is kept for longer runs and
bigger models, while ``add_gap`` is the hard embedded task.

A three-shift gap (4-6) leaves some seeds with nothing to sample (held-out pass@8 0.0); words of
3-5 letters make the warm start slower (~85 s) and the start 0.0 for two seeds of three. The
sibling task "reverse a word, never seen at length 5" is too easy for RL (0.03 -> 0.96 in 100
steps: only the stop after five letters is missing).

What it is not: a loader (``rollflow.data.synthetic.synthetic_rows`` draws the prompt sets) or a reward.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from rollflow.data.tasks import Split, check_split, draw, hash_byte

NAME = "shift_gap"
LETTERS = "abcdefghijklmnop"
SHIFTS = tuple(range(1, 10))
GAP_SHIFTS = (4, 5)  # never seen by the warm start
WORDS_PER_LENGTH = {2: 256, 3: 300, 4: 300}  # 2 letters: all of them
MAX_ANSWER_CHARS = max(WORDS_PER_LENGTH)
MIN_WARM_START_STEPS = 1000  # at 500 steps (batch 64) two seeds of three end at loss 0.2-0.4
warm_start_example = None  # trained on prompt + label (the SyntheticTask protocol's optional hooks)
warm_start_probe = None
_HELD_OUT_BYTE_BELOW = 64  # of the gap problems, sha256 first byte < 64 (1/4) is held out


@dataclass(frozen=True)
class ShiftProblem:
    """``word+k=``: ``answer`` is the word with each letter ``k`` places further."""

    word: str
    k: int

    @property
    def text(self) -> str:
        return f"{self.word}+{self.k}="

    @property
    def answer(self) -> str:
        return "".join(chr(ord(c) + self.k) for c in self.word)

    @property
    def in_gap(self) -> bool:
        """A shift the warm start never sees."""
        return self.k in GAP_SHIFTS


@cache
def words() -> tuple[str, ...]:
    """The 856 words, by length, each length in ``sha256`` order (a fixed, scrambled choice)."""
    chosen: list[str] = []
    for length, n in WORDS_PER_LENGTH.items():
        every = ("".join(t) for t in itertools.product(LETTERS, repeat=length))
        chosen += sorted(every, key=lambda w: hashlib.sha256(w.encode("ascii")).digest())[:n]
    return tuple(chosen)


def is_held_out(problem: ShiftProblem) -> bool:
    """Fixed membership of the held-out split: a gap problem whose text hashes below 64."""
    return problem.in_gap and hash_byte(problem.text) < _HELD_OUT_BYTE_BELOW


@cache
def problem_pool(split: Split) -> tuple[ShiftProblem, ...]:
    """All problems of a split in a fixed order (7,302 train, 402 test)."""
    check_split(split)
    want_held_out = split == "test"
    return tuple(p for k in SHIFTS for w in words() if is_held_out(p := ShiftProblem(w, k)) == want_held_out)


@cache
def warm_start_pool() -> tuple[ShiftProblem, ...]:
    """The warm start's support: the 5,992 problems with a shift of 1-3 or 6-9."""
    return tuple(p for p in problem_pool("train") if not p.in_gap)


def sample_problems(split: Split, n: int, *, seed: int) -> list[ShiftProblem]:
    """``n`` distinct problems of ``split`` in random order; deterministic for ``(split, n, seed)``."""
    return draw(problem_pool(split), n, split=split, stream=f"rollflow-synthetic:{NAME}:{split}:{seed}")


def warm_start_label(problem: ShiftProblem, rng: random.Random, p_correct: float) -> str:
    """Always the right answer (no habit): ``rng`` and ``p_correct`` are unused."""
    del rng, p_correct
    return problem.answer


def problem_row(problem: ShiftProblem, split: Split) -> dict[str, Any]:
    """A dataset row in the loader's format; ``out_of_support`` marks a gap problem."""
    return {
        "prompt_id": f"synthetic-{NAME}-{split}-{problem.word}+{problem.k}",
        "messages": [{"role": "user", "content": problem.text}],
        "answer": problem.answer,
        "out_of_support": problem.in_gap,
    }
