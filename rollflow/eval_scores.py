"""What an evaluation's numbers mean: "correct", binary rewards, the evaluation set's digest and the base split.

What it is:

* ``score_rewards(rewards, correct_reward)``: accuracy, mean reward and whether the rewards are binary.
  A completion is correct when its reward is ``>= correct_reward`` (``eval.correct_reward``, 1.0 by
  default), so accuracy = #{r_i >= c} / n and mean reward = sum(r_i) / n. The rewards are *binary* when
  every one is either 0 or ``>= c``; a partial-credit reward (0.5 for a half-right answer) is not, and then
  accuracy says little (every run may score 0), so the registry gate compares the mean reward instead.
* ``eval_set_digest(prompts)``: ``sha256:<hex>`` of the held-out rows themselves, in order: each row as
  canonical JSON (sorted keys), one per line. Two evaluations are comparable only when their digests
  are equal: same prompts, same answers, same order. It depends on nothing but the rows.
* ``BaseSplit``: which held-out problems the starting policy solved in the trial's 'before' evaluation
  (``solved[i]`` for row i of the evaluation set named by ``eval_set``). Every later evaluation of the
  same set reports accuracy on each half::

      accuracy_base_solved   = #{i solved at the start and correct now} / #{i solved at the start}
      accuracy_base_unsolved = #{i unsolved at the start and correct now} / #{i unsolved at the start}

  The first is retention (falling means the policy forgets what it knew); the second is learning.
  A half with no problem is left out rather than reported as 0.
* ``EvalResult``: one evaluation's figures (accuracy, mean reward, the versions that generated, the rows
  scored, the reward errors and timeouts, ``eval_set``) and its ``retention`` against a base split.

What it is not: the evaluation itself (``rollflow.evaluation``) nor where these are stored
(``rollflow.trial_record``); nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def score_rewards(rewards: Sequence[float], correct_reward: float = 1.0) -> tuple[float, float, bool]:
    """(accuracy, mean reward, binary) of ``rewards`` (see the module docstring); (0, 0, True) for none."""
    if not rewards:
        return 0.0, 0.0, True
    n = len(rewards)
    accuracy = sum(r >= correct_reward for r in rewards) / n
    binary = all(r == 0.0 or r >= correct_reward for r in rewards)
    return accuracy, sum(rewards) / n, binary


def eval_set_digest(prompts: Iterable[dict[str, Any]]) -> str:
    """``sha256:<hex>`` of the rows, in order, each as canonical JSON (sorted keys) on its own line."""
    h = hashlib.sha256()
    for row in prompts:
        h.update(json.dumps(row, sort_keys=True, separators=(",", ":"), default=str).encode())
        h.update(b"\n")
    return f"sha256:{h.hexdigest()}"


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


@dataclass
class EvalResult:
    accuracy: float
    mean_reward: float
    n: int
    versions: dict[int, int]  # policy version -> number of completions generated under it
    seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    reward_errors: int = 0  # rewards that raised, returned a bad value or got no worker (scored 0)
    reward_timeouts: int = 0  # rewards that ran past the runner's timeout (scored 0)
    binary: bool = True  # every reward was 0 or >= the correct threshold (rollflow.eval_scores)
    eval_set: str = ""  # digest of the held-out rows scored (eval_set_digest); "" = not known

    def retention(self, split: BaseSplit | None) -> dict[str, float]:
        """``accuracy_base_solved`` / ``accuracy_base_unsolved`` against the trial's base split ({} without
        one, or for another evaluation set)."""
        return {} if split is None else split.accuracies(self.rows, self.eval_set)

    @property
    def version(self) -> int:
        """The policy version most completions came from."""
        return max(self.versions, key=lambda v: self.versions[v]) if self.versions else -1
