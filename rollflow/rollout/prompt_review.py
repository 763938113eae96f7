"""`PromptReview`: bring solved prompts back before the policy forgets them, in place of fresh ones.

What it is. GRPO learns an unsolved problem by moving the policy, and the move can break problems the
policy solved (a held-back task kept 0.65 of its start-solved problems; the suite's test families
0.59-0.73, TRL too). A regression shows up only when the prompt is generated again, and a plain epoch
order brings it back once per pass over the train split. The later a regression is caught, the more it
costs to repair: a prompt that still solves in some samples gives a mixed group, whose advantages push
the correct samples up (a repair in one step); one that solves in none gives a flat group and no
gradient at all. So the review brings mastered prompts back early, while a regression is still partial.

The rule (pre-rollout replacement, no extra generation):

* **mastered**: a prompt whose finished group was all solved (every reward >= ``solved_reward``) joins
  the review set, due ``interval`` policy versions later (``rollout.review_interval``);
* **review**: each fed prompt about to start adds ``share`` (``rollout.review_share``) to a credit capped
  at 1; when the credit is 1 and a prompt is due, the most overdue one runs in that slot instead, and the
  credit drops by 1. The slot's position is unchanged, so the staleness bound, the claim log and
  exactly-once by group see one group as before; the displaced prompt comes back in its next epoch.
  Reviews therefore take at most ``share`` of the generation in any run of slots, never add to it, and
  never come in a burst (a credit unused while nothing was due is not banked):

      reviews in any n consecutive slots <= share * n + 1      (fed prompts; submitted rows never)

* **outcome**: still all solved -> due again after twice its interval (spaced repetition: a prompt that
  holds is checked less often); mixed (a regression caught while partial: this group is its repair) ->
  due again after ``interval``; all wrong (lost: no gradient to gain from reviewing it) -> dropped; it
  comes back with its epoch like any other prompt.

Worked example: ``share`` 0.25 and ``train.batch_size`` 16 give up to 4 reviews per step. At 5 newly
mastered prompts per step with interval 4, doubling, a prompt needs about ``log2(T / 4)`` reviews over
``T`` steps, more than the budget, so the most overdue go first and the share is what binds.

What it is not: a replay buffer (nothing generated is reused: a review is a fresh group from the current
policy), the prompt curriculum (``rollflow.rollout.prompt_filter``, which skips prompts), or state that
survives a restart: the set is in this process's memory and re-learnt from the groups of the next pass.
A partial episode cut at a graceful stop while it reviewed a prompt is generated afresh on resume (its
saved tokens belong to another prompt than the position's own, so they do not match).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollflow.rollout.filters import group_outcome

if TYPE_CHECKING:
    from rollflow.api.config import RolloutConfig

MAX_INTERVAL_DOUBLINGS = 6  # an interval grows to at most 2**6 times its base (64 x interval versions)


@dataclass
class _Card:
    row: dict[str, Any]
    interval: int  # versions until its next review
    due: int  # the policy version from which it may be reviewed
    reviewing: bool = False  # handed out for review, its group not back yet


class PromptReview:
    """Replaces up to ``share`` of the fed prompts with solved prompts that are due; see the module docstring."""

    def __init__(self, share: float, interval: int, *, solved_reward: float = 1.0) -> None:
        if not 0.0 < share <= 0.5:
            raise ValueError(f"share must be in (0, 0.5], got {share}: the rest of each batch learns")
        if interval < 1:
            raise ValueError(f"interval must be >= 1 policy version, got {interval}")
        self.share, self.interval, self.solved_reward = share, interval, solved_reward
        self._cards: dict[str, _Card] = {}  # prompt id -> its card (mastered prompts only)
        self._queue: list[tuple[int, int, str]] = []  # (due, tie-break, prompt id); stale entries skipped
        self._pending: dict[str, dict[str, Any]] = {}  # prompt id -> row, handed out, group not back
        self._seq = 0
        self._credit = 0.0  # reviews owed: + share per started prompt, at most 1 (no burst), - 1 per review
        self._lock = threading.Lock()
        self.started = 0  # fed prompts started (reviews included)
        self.counts = {"reviewed": 0, "held": 0, "regressed": 0, "lost": 0}

    def __len__(self) -> int:
        return len(self._cards)

    def swap(self, data: dict[str, Any], version: int) -> dict[str, Any]:
        """The row to start in this fed slot: a due solved prompt while the share allows, else ``data``."""
        with self._lock:
            self.started += 1
            self._credit = min(1.0, self._credit + self.share)
            row = data
            if self._credit >= 1.0 - 1e-9:
                pid = self._pop_due_locked(version)
                if pid is not None:
                    card = self._cards[pid]
                    card.reviewing = True
                    row = card.row
                    self._credit -= 1.0
                    self.counts["reviewed"] += 1
            self._pending[str(row.get("prompt_id"))] = row
            return row

    def observe(self, prompt_id: str, rewards: Sequence[float], version: int) -> None:
        """Record a finished group of ``prompt_id`` (accepted or not) at policy ``version``."""
        with self._lock:
            row = self._pending.pop(prompt_id, None)
            if not rewards:
                return
            card = self._cards.get(prompt_id)
            kind = group_outcome(rewards, self.solved_reward)
            reviewed = card is not None and card.reviewing
            if kind == "solved":
                if card is None:
                    if row is None:  # not handed out through swap (a submitted row): nothing to replay
                        return
                    card = self._cards[prompt_id] = _Card(row=row, interval=self.interval, due=0)
                elif reviewed:
                    card.interval = min(card.interval * 2, self.interval << MAX_INTERVAL_DOUBLINGS)
                    self.counts["held"] += 1
                self._schedule_locked(prompt_id, card, version)
            elif card is not None:
                if kind == "signal":  # caught while partial: this group repairs it
                    self.counts["regressed"] += reviewed
                    card.interval = self.interval
                    self._schedule_locked(prompt_id, card, version)
                else:  # solved by no sample: nothing to repair from here
                    self.counts["lost"] += reviewed
                    del self._cards[prompt_id]

    def metrics(self) -> dict[str, float]:
        """``review/...``: how many reviews ran and how they came out, and the set's size."""
        with self._lock:
            out = {f"review/{k}": float(v) for k, v in self.counts.items()}
            out["review/mastered"] = float(len(self._cards))
            out["review/share"] = self.counts["reviewed"] / self.started if self.started else 0.0
            return out

    def _schedule_locked(self, prompt_id: str, card: _Card, version: int) -> None:
        card.reviewing = False
        card.due = version + card.interval
        self._seq += 1
        heapq.heappush(self._queue, (card.due, self._seq, prompt_id))

    def _pop_due_locked(self, version: int) -> str | None:
        while self._queue and self._queue[0][0] <= version:
            due, _, pid = heapq.heappop(self._queue)
            card = self._cards.get(pid)
            if card is not None and not card.reviewing and card.due == due:
                return pid
        return None


def build_review(rc: RolloutConfig) -> PromptReview | None:
    """The review ``rollout.review_share`` / ``review_interval`` ask for, or None when the share is 0."""
    if not rc.review_share:
        return None
    return PromptReview(rc.review_share, rc.review_interval, solved_reward=rc.solved_reward)
