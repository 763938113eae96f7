"""What an evaluation's numbers mean: "correct", binary rewards and the evaluation set's digest.

What it is:

* ``score_rewards(rewards, correct_reward)``: accuracy, mean reward and whether the rewards are binary.
  A completion is correct when its reward is ``>= correct_reward`` (``eval.correct_reward``, 1.0 by
  default), so accuracy = #{r_i >= c} / n and mean reward = sum(r_i) / n. The rewards are *binary* when
  every one is either 0 or ``>= c``; a partial-credit reward (0.5 for a half-right answer) is not, and then
  accuracy says little (every run may score 0), so the registry gate compares the mean reward instead.
* ``eval_set_digest(prompts)``: ``sha256:<hex>`` of the held-out rows themselves, in order: each row as
  canonical JSON (sorted keys), one per line. Two evaluations are comparable only when their digests
  are equal: same prompts, same answers, same order. It depends on nothing but the rows.
* ``EvalResult``: one evaluation's figures (accuracy, mean reward, the versions that generated, the rows
  scored, the reward errors and timeouts, ``eval_set``) and its ``retention`` against the trial's base
  split (``rollflow.trial.base_split``).

What it is not: the evaluation itself (``rollflow.evaluation``) nor where these are stored
(``rollflow.trial.evaluations``); nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollflow.trial.base_split import BaseSplit


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
