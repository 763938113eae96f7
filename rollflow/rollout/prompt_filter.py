"""`PromptCurriculum`: do not generate, most of the time, for a prompt whose last group taught nothing.

What it is. A GRPO group whose rewards are all equal has every advantage exactly zero,

    A_i = (r_i - mean_g) / (std_g + eps) = 0    for every i when r_1 = ... = r_n,

so its ``group_size`` completions buy no gradient. On a sparse task most of the generation goes there:
on add_gap 64 % of the train prompts are problems the warm start already solves (every sample right) and
most of the rest are all wrong at first; 93 % of the groups carry no signal. Dynamic sampling drops such
groups *after* paying for them; this curriculum avoids generating them. It remembers, per prompt id, how
the prompt's most recent finished group came out:

* ``solved``   -- every reward equal and >= ``solved_reward`` (the eval's "correct", 1.0 by default);
* ``unsolved`` -- every reward equal and below it;
* ``signal``   -- rewards differ (or the prompt was never seen).

When the executor is about to start a prompt it skips a ``solved`` one with probability
``skip_solved`` (``rollout.skip_solved_prob``) and an ``unsolved`` one with ``skip_unsolved``
(``rollout.skip_unsolved_prob``); a ``signal`` or unseen prompt always runs. A skipped prompt is not
generated: it is released like a rejected group (``rollout/rejected_skipped``), so the staleness bound
and the claim accounting are unchanged, and it comes back in a later epoch, where it runs with
probability ``1 - p`` and its record is refreshed. So a prompt whose status changes is found again after
about ``1 / (1 - p)`` epochs, and the expected generation per epoch, with shares ``s`` of solved and ``u``
of unsolved prompts, is

    1 - s * skip_solved - u * skip_unsolved     of the full epoch's.

The two kinds get their own probability because they age differently: an unsolved prompt is where the
next signal appears as the policy generalises, so it is revisited sooner.

The bound on a hidden regression. A policy does forget problems it solved while it learns others (seen
on a task whose held-out set holds problems the warm start already solved: their accuracy fell from 0.94
to 0.60-0.65 under a curriculum at 0.97, against 0.83-0.92 without one). A skipped prompt cannot show
that it regressed, so no prompt is skipped more than ``max_streak`` (``rollout.curriculum_max_skips``)
times in a row: after ``N`` consecutive skips it runs the next time it comes up, whatever the draw.
Every prompt is therefore generated at least once in every ``N + 1`` consecutive passes over the train
split, and a solved prompt that starts failing gives a group with signal (a gradient that repairs it)
within

    (N + 1) passes  =  (N + 1) * n_rows / train.batch_size  optimizer steps at most

(fewer, since skipped prompts fill no batch). Worked example: N = 3, 2,000 prompts, batch 16 -> within
4 passes = 500 steps. The expected share of a solved prompt's passes that generate it rises from
``1 - p`` to ``(1 - p) / (1 - p^(N+1))`` (p = 0.97, N = 3: 0.03 -> 0.26).

Decided at claim time. The prompt source claims prompts in blocks of ``K`` and may claim one only while
the staleness bound has room for all of it (``rollflow.rollout.prompt_source``). Most of a block is
skipped under a curriculum, so counting its skipped prompts against the bound would hold back up to
``K - 1`` places of the window for nothing (measured: 20-30 % fewer steps at ``K`` = 4, ``B`` = 16,
staleness 1). So the source asks ``decide_ahead`` for the block's prompts before it claims: the skips
are drawn then, counted out of the claim, and kept per position for ``skip`` to apply when each prompt
is pulled. A source without positions (a plain ``feed``) gets its skips drawn on ``skip``.

What changes per step: a batch holds the same ``train.batch_size`` groups, more of them with signal, so
one optimizer step moves the policy more (the token-mean loss over the batch counts every token, those of
flat groups too). Measured in docs/benchmarks.md ("The prompt curriculum: why, and the claim fix").

What it is not: dynamic sampling (that one filters finished groups), a difficulty model, or a sampler
that reorders prompts; the epoch order is the prompt source's. The memory is one small record per prompt
seen, in this process: a restart forgets it and re-learns it in one epoch.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from rollflow.rollout.filters import GroupOutcome as Outcome
from rollflow.rollout.filters import group_outcome

if TYPE_CHECKING:
    from rollflow.api.config import RolloutConfig


class PromptCurriculum:
    """Skips prompts whose last group was all-solved / all-unsolved with ``skip_solved`` / ``skip_unsolved``."""

    def __init__(
        self,
        skip_solved: float,
        skip_unsolved: float,
        *,
        solved_reward: float = 1.0,
        seed: int = 0,
        max_streak: int | None = None,
    ) -> None:
        """``max_streak``: a prompt skipped this many times in a row runs the next time (None: no bound)."""
        if max_streak is not None and max_streak < 0:
            raise ValueError(f"max_streak must be >= 0 or None, got {max_streak}")
        self.max_streak = max_streak
        for name, p in (("skip_solved", skip_solved), ("skip_unsolved", skip_unsolved)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {p}: 1 would never revisit a prompt")
        self.skip_prob: dict[Outcome, float] = {
            "solved": skip_solved,
            "unsolved": skip_unsolved,
            "signal": 0.0,
        }
        self.solved_reward = solved_reward
        self._rng = random.Random(f"prompt-curriculum-{seed}")
        self._last: dict[str, Outcome] = {}  # prompt id -> how its last finished group came out
        self._ahead: dict[int, Outcome | None] = {}  # position -> skipped kind (None: runs), drawn ahead
        self._streak: dict[str, int] = {}  # prompt id -> skips in a row since it last ran
        self._lock = threading.Lock()
        self.skipped: dict[Outcome, int] = {"solved": 0, "unsolved": 0, "signal": 0}
        self.observed: dict[Outcome, int] = {"solved": 0, "unsolved": 0, "signal": 0}

    def outcome(self, rewards: Sequence[float]) -> Outcome:
        """``solved``, ``unsolved`` or ``signal`` for one finished group's rewards."""
        return group_outcome(rewards, self.solved_reward)

    def observe(self, prompt_id: str, rewards: Sequence[float]) -> None:
        """Record a finished group of ``prompt_id`` (accepted or not)."""
        if not rewards:
            return
        kind = self.outcome(rewards)
        with self._lock:
            self._last[prompt_id] = kind
            self._streak.pop(prompt_id, None)  # it ran: the streak starts over
            self.observed[kind] += 1

    def _draw_locked(self, prompt_id: str) -> Outcome | None:
        """The kind to skip ``prompt_id`` as, or None if it runs (one draw)."""
        kind = self._last.get(prompt_id, "signal")
        if self.max_streak is not None and self._streak.get(prompt_id, 0) >= self.max_streak:
            return None  # skipped max_streak times in a row: it runs now (the regression bound)
        p = self.skip_prob[kind]
        return kind if p > 0.0 and self._rng.random() < p else None

    def decide_ahead(self, items: Sequence[tuple[int, str]]) -> int:
        """Draw now whether each ``(position, prompt_id)`` will be skipped; how many will be.

        Called by the prompt source before it claims a block: the skips do not count against the claim.
        A position already decided keeps its decision (a claim retried on a later tick draws nothing new);
        decisions for positions below the block are dropped (a block another worker claimed first).
        """
        if not items:
            return 0
        with self._lock:
            start = min(p for p, _ in items)
            for stale in [q for q in self._ahead if q < start]:
                del self._ahead[stale]
            n = 0
            for position, prompt_id in items:
                if position not in self._ahead:
                    self._ahead[position] = self._draw_locked(prompt_id)
                n += self._ahead[position] is not None
            return n

    def skip(self, prompt_id: str, position: Hashable = None) -> bool:
        """Whether not to generate ``prompt_id`` now (counted in ``skipped``): the decision drawn ahead
        for ``position`` if there is one, else a draw now."""
        with self._lock:
            if position is not None and position in self._ahead:
                kind = self._ahead.pop(position)
            else:
                kind = self._draw_locked(prompt_id)
            if kind is None:
                return False
            self.skipped[kind] += 1
            self._streak[prompt_id] = self._streak.get(prompt_id, 0) + 1
            return True

    def metrics(self) -> dict[str, float]:
        """Skips so far by kind, and the shares of finished groups by outcome."""
        n = sum(self.observed.values())
        out = {f"prompt_filter/skipped_{k}": float(v) for k, v in self.skipped.items() if k != "signal"}
        for kind, count in self.observed.items():
            out[f"prompt_filter/{kind}_frac"] = count / n if n else 0.0
        return out


def build_curriculum(rc: RolloutConfig, *, seed: int) -> PromptCurriculum | None:
    """The curriculum ``rollout.skip_solved_prob`` / ``skip_unsolved_prob`` ask for (defaults resolved by
    ``RolloutConfig.curriculum_probs``), or None when both are 0."""
    solved, unsolved = rc.curriculum_probs()
    if solved <= 0 and unsolved <= 0:
        return None
    return PromptCurriculum(
        solved, unsolved, solved_reward=rc.solved_reward, seed=seed, max_streak=rc.curriculum_max_skips
    )
