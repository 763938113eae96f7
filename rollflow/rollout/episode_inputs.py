"""`EpisodeInputs`: what the executor may start next, in order: submitted rows, then a fed source.

What it is: the executor's input side, touched only on its event-loop thread. Rows queued with
``submit`` come first (each may carry the caller's future); then the ``feed``-ed source is pulled lazily,
one item per start, so a data cursor moves only when an episode starts. A source item of ``None`` means
"nothing may start now" (ask again on a later tick); the source ends with ``StopIteration``. Rows the
``prompt_filter`` skips never start: they take no capacity and count as ``rejected["skipped"]``. A
fed row that starts may be replaced by a solved prompt the ``review`` brings back (same key, same slot).
Every row handed out is reported to ``StalenessManager.on_rollout_enqueued``.

What it is not: admission (the executor asks ``StalenessManager.try_submit`` before it starts an input).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable, Iterator
from typing import Any

from rollflow.rollout.executor_stats import ExecutorStats
from rollflow.rollout.prompt_filter import PromptCurriculum
from rollflow.rollout.prompt_review import PromptReview
from rollflow.rollout.staleness import StalenessManager

MAX_SKIPS_PER_CALL = 256  # skipped rows pulled in one call before the scheduler gets the loop back
Input = tuple[Hashable, dict[str, Any], "asyncio.Future | None"]
Source = Iterator[tuple[Hashable, dict[str, Any]] | None]


class EpisodeInputs:
    """Submitted rows first, then the fed source; see the module docstring."""

    def __init__(
        self,
        staleness: StalenessManager,
        stats: ExecutorStats,
        prompt_filter: PromptCurriculum | None,
        review: PromptReview | None = None,
    ) -> None:
        self.staleness, self.stats, self.prompt_filter, self.review = staleness, stats, prompt_filter, review
        self._queued: collections.deque[Input] = collections.deque()
        self._source: Source | None = None

    def __bool__(self) -> bool:
        """Anything queued, or a source not yet exhausted."""
        return bool(self._queued) or self._source is not None

    def feed(self, source: Source) -> None:
        self._source = source

    def submit(self, key: Hashable, data: dict[str, Any], future: asyncio.Future | None) -> None:
        self._queued.append((key, data, future))
        self.staleness.on_rollout_enqueued()

    def put_back(self, item: Input) -> None:
        """Return an input taken by ``next`` that could not start after all (it starts first next time)."""
        self._queued.appendleft(item)

    def queued_keys(self) -> list[Hashable]:
        return [key for key, _, _ in self._queued]

    def clear(self) -> list[asyncio.Future | None]:
        """Drop everything (the executor closes); the futures of queued rows, for the caller to cancel."""
        futures = [fut for _, _, fut in self._queued]
        self._queued.clear()
        self._source = None
        return futures

    def next(self, version: int = 0) -> Input | None:
        """The next input that may start, or None (nothing queued, the source says wait, or is done);
        ``version``: the policy version now (the review's clock)."""
        if self._queued:
            return self._queued.popleft()
        for _ in range(MAX_SKIPS_PER_CALL):
            if self._source is None:
                return None
            try:
                item = next(self._source)
            except StopIteration:
                self._source = None
                return None
            if item is None:  # the source has nothing that may start now; ask again on a later tick
                return None
            key, data = item
            if self.prompt_filter is not None and self.prompt_filter.skip(str(data.get("prompt_id")), key):
                # never generated: it takes no capacity, and counts as released (the claim log's bound)
                self.stats.rejected["skipped"] += 1
                continue
            if self.review is not None:
                data = self.review.swap(data, version)
            self.staleness.on_rollout_enqueued()
            return key, data, None
        return None  # many skips in a row: let the scheduler breathe, go on next tick
