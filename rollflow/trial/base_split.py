"""A trial's base split: which held-out problems the starting policy solved, decided once and kept.

What it is:

* ``BaseSplit``: which held-out problems the starting policy solved in the trial's 'before' evaluation
  (``solved[i]`` for row i of the evaluation set named by ``eval_set``). Every later evaluation of the
  same set reports accuracy on each half::

      accuracy_base_solved   = #{i solved at the start and correct now} / #{i solved at the start}
      accuracy_base_unsolved = #{i unsolved at the start and correct now} / #{i unsolved at the start}

  The first is retention (falling means the policy forgets what it knew); the second is learning.
  A half with no problem is left out rather than reported as 0.
* ``record/base-split.json`` (``storage.keys.BASE_SPLIT_KEY``): the split the 'before' evaluation decided,
  written once (create-only, ``write_base_split``); a resume reads it back (``read_base_split``), so the
  split never moves.

What it is not: the evaluation (``rollflow.evaluation``) or its scores (``rollflow.eval_scores``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollflow.api.errors import CorruptRecordError
from storage import keys
from storage.errors import CommitConflictError
from storage.fs import Storage


@dataclass(frozen=True)
class BaseSplit:
    """Row i of evaluation set ``eval_set`` was solved by the starting policy iff ``solved[i]``."""

    eval_set: str
    solved: tuple[bool, ...]
    correct_reward: float = 1.0

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]], eval_set: str, correct_reward: float) -> BaseSplit:
        """The split the 'before' evaluation's ``rows`` (each with a ``reward``) decide."""
        return cls(eval_set, tuple(float(r["reward"]) >= correct_reward for r in rows), correct_reward)

    def accuracies(self, rows: Sequence[dict[str, Any]], eval_set: str) -> dict[str, float]:
        """``accuracy_base_solved`` / ``accuracy_base_unsolved`` of an evaluation's ``rows``; {} when the
        rows are not of this split's evaluation set (another digest or another count)."""
        if eval_set != self.eval_set or len(rows) != len(self.solved):
            return {}
        out: dict[str, float] = {}
        for name, side in (("accuracy_base_solved", True), ("accuracy_base_unsolved", False)):
            half = [
                float(r["reward"]) >= self.correct_reward
                for r, s in zip(rows, self.solved, strict=True)
                if s == side
            ]
            if half:
                out[name] = sum(half) / len(half)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "eval_set": self.eval_set,
            "correct_reward": self.correct_reward,
            "solved": [int(s) for s in self.solved],
            "n_solved": sum(self.solved),
            "n": len(self.solved),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BaseSplit:
        return cls(str(doc["eval_set"]), tuple(bool(s) for s in doc["solved"]), float(doc["correct_reward"]))


def read_base_split(storage: Storage) -> BaseSplit | None:
    """The trial's base split, or None before its 'before' evaluation.

    Raises:
        CorruptRecordError: the file exists but is not a base split. It is left as it is: a new split
            written over it would move the split the trial's retention figures were measured on.
    """
    try:
        return BaseSplit.from_json(storage.get_json(keys.BASE_SPLIT_KEY))
    except FileNotFoundError:
        return None
    except (KeyError, TypeError, ValueError) as e:  # not JSON, or JSON that is no base split
        raise CorruptRecordError(
            f"{storage.root_uri}/{keys.BASE_SPLIT_KEY} cannot be read ({type(e).__name__}: {e}); it was left "
            "untouched. Restore it from a backup or your bucket's versioning; deleting it lets the next "
            "evaluation decide a new split, and the retention figures before and after would then not compare"
        ) from None


def write_base_split(storage: Storage, split: BaseSplit) -> BaseSplit:
    """Store ``split`` unless one is stored already; returns the one the trial keeps."""
    try:
        storage.put_json(keys.BASE_SPLIT_KEY, split.to_json(), exclusive=True)
    except CommitConflictError:
        kept = read_base_split(storage)
        return kept if kept is not None else split
    return split
