"""The synthetic task families of the embedded default, and the contract each family module keeps.

What it is. One module per family, chosen by ``dataset.synthetic.task``:

* ``add_habit`` (``add_habit.py``) - two-digit addition with a planted off-by-one habit. RL only has
  to drop the habit, so it climbs in ~30 GRPO steps: the fast smoke test (``configs/tiny_cpu.yaml``).
* ``add_gap`` (``add_gap.py``) - two-digit addition whose warm start never saw an operand in 40-59;
  held-out problems all have one. RL must make the model generalise to the unseen operand range.
* ``shift_gap`` (``shift_gap.py``) - shift every letter of a short word by ``k`` (``"abc+3=" -> "def"``);
  the warm start never saw ``k`` = 4 or 5, and held-out problems all use one of them.
* ``tool_lookup`` (``tool_lookup.py``) - an agent's multi-turn tool use: the answer is a table value
  only the ``lookup`` tool knows; the warm start has an answer-without-the-tool habit RL removes
  (``configs/tiny_agent.yaml``). Its warm start renders whole conversations (``warm_start_example``).

Each family module offers the same functions (the ``SyntheticTask`` protocol below): the fixed
problem pool of a split, the problems the warm start may train on, the warm-start label, a
deterministic draw of ``n`` problems and the dataset row of a problem. ``rollflow.data.synthetic``
picks the module by name; ``rollflow.models.bootstrap`` trains the warm start from it.

Splits are fixed by a hash of the problem text (never by a seed or a size), so no setting can move a
problem between train and held-out, and the warm start never sees a held-out problem.

What it is not: a registry or a plugin system. Adding a family means a module here, a name in
``SyntheticTaskConfig.task`` and a line in ``rollflow.data.synthetic.task_module``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

Split = Literal["train", "test"]
P = TypeVar("P")


class SyntheticProblem(Protocol):
    """A problem: the prompt text (one user turn) and the exact reference answer."""

    @property
    def text(self) -> str: ...

    @property
    def answer(self) -> str: ...


@dataclass(frozen=True)
class SumProblem:
    """``a+b=`` with the true sum as answer: the problem of both addition families (each adds its own
    properties in a subclass)."""

    a: int
    b: int

    @property
    def text(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


class SyntheticTask(Protocol):
    """What a family module provides (modules satisfy it structurally; see ``add_gap.py``)."""

    MAX_ANSWER_CHARS: int  # longest warm-start label, so the warm start can size its batches
    MIN_WARM_START_STEPS: int  # fewer steps leave the support unlearnt for some seeds (a warning)
    # The warm start's optional hooks; None in a family trained on prompt + label. A multi-turn family
    # (tool_lookup) renders whole conversations, (ids, loss mask) per example, and has a probe
    # conversation (rollflow.models.warm_start_probe; then it also sets WARM_START_PROBE_PASS).
    warm_start_example: Callable[[Any, random.Random, float, Any], tuple[list[int], list[int]]] | None
    warm_start_probe: Callable[[random.Random, Any], tuple[list[int], dict[str, int]]] | None

    def problem_pool(self, split: Split) -> Sequence[SyntheticProblem]: ...

    def warm_start_pool(self) -> Sequence[SyntheticProblem]: ...

    def warm_start_label(self, problem: Any, rng: random.Random, p_correct: float) -> str: ...

    def sample_problems(self, split: Split, n: int, *, seed: int) -> list[Any]: ...

    def problem_row(self, problem: Any, split: Split) -> dict[str, Any]: ...


def hash_byte(text: str) -> int:
    """The first byte of ``sha256(text)``: a fixed, uniform-looking number in 0..255 per problem."""
    return hashlib.sha256(text.encode("ascii")).digest()[0]


def check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"synthetic split must be 'train' or 'test', got {split!r}")


def draw(pool: Sequence[P], n: int, *, split: Split, stream: str) -> list[P]:
    """``n`` distinct problems of ``pool`` in random order, from the seeded stream ``stream``.

    Raises:
        ValueError: the pool holds fewer than ``n`` problems; the message says which setting to lower.
    """
    if not 0 < n <= len(pool):
        raise ValueError(
            f"the synthetic {split!r} split has {len(pool)} problems, but {n} were asked; set "
            f"dataset.synthetic.{'n_train' if split == 'train' else 'n_eval'} between 1 and {len(pool)}"
        )
    return random.Random(stream).sample(list(pool), n)
