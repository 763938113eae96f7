"""`OrderedWriter`: a `ShardSink` driven from the rollout event loop, in order, off the loop thread.

What it is: the executor's writer-watermark bookkeeping. Every sink call (``add``, ``maybe_flush``,
``flush``, and extra work queued with ``submit``) runs on one worker thread, in the order it was queued,
so the loop never blocks on storage. Each ``add`` gets a sequence number; a sink call queued with
``watermark = w`` that returns truthy has committed every add numbered ``<= w`` (the sink writes adds in
order, and a flush covers all adds queued before it), so those keys leave ``buffered_keys``. Each commit is
counted by its cause in ``stats.flush_causes``: ``fill`` (an ``add`` reached the sink's ``flush_rows``),
``timer`` (the oldest row reached the sink's age limit), ``gate`` (a forced flush: the caller can admit no
more work, so waiting for either would stall the trainer), ``close``. At most one
``maybe_flush`` is in flight. ``max_failures`` failed sink calls in a row are fatal: ``on_fatal`` gets a
``RolloutFailureError``; a success resets the count.

Worked example: add(k1) = 1, add(k2) = 2, maybe_flush queued with watermark 2, add(k3) = 3. The flush
returns True: k1 and k2 are committed, ``buffered_keys() == [k3]``.

What it is not: no scheduling or judging of episodes (``WorkflowExecutor``), no shard format (the sink).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollflow.api.errors import RolloutFailureError
from rollflow.api.stores import CommittedRows, ShardSink
from rollflow.rollout.executor_stats import ExecutorStats
from storage.schema import TrajectoryGroup

logger = logging.getLogger(__name__)


class OrderedWriter:
    """See the module docstring. Create and call it on the event loop's thread only."""

    def __init__(
        self,
        sink: ShardSink,
        loop: asyncio.AbstractEventLoop,
        stats: ExecutorStats,
        *,
        max_failures: int,
        on_commit: Callable[[], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        """``on_commit()`` runs on the loop thread after each call that committed adds; ``on_fatal(exc)``
        once ``max_failures`` sink calls in a row failed (again for each further failure)."""
        self.sink, self._loop, self.stats = sink, loop, stats
        self.max_failures = max_failures
        self._on_commit, self._on_fatal = on_commit, on_fatal
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-writer")
        self._futures: set[asyncio.Future[Any]] = set()
        self._seq = self._failures = 0
        self._buffered: collections.deque[tuple[int, Hashable]] = collections.deque()
        self._flush_inflight = False

    def add(self, group: TrajectoryGroup, key: Hashable) -> None:
        """Queue ``sink.add(group)``; ``key`` stays in ``buffered_keys`` until a commit covers it. An int
        ``key`` (the rollout loop's prompt position) becomes ``group.position``, which the commit record
        keeps, so a resume can tell a committed position from an open one."""
        if isinstance(key, int) and not isinstance(key, bool):
            group.position = key
        self._seq += 1
        self._buffered.append((self._seq, key))
        self._call(self.sink.add, group, watermark=self._seq)

    def flush(self, *, force: bool) -> None:
        """Queue ``sink.maybe_flush`` (``sink.flush`` if ``force``) unless one is in flight or nothing waits."""
        if self._flush_inflight or not (self._buffered or force):
            return
        self._flush_inflight = True
        fn = self.sink.flush if force else self.sink.maybe_flush
        self._call(fn, watermark=self._seq, flush=True, cause="gate" if force else "timer")

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the writer thread after every call queued so far."""
        self._call(fn, *args, watermark=None)

    def buffered_keys(self) -> list[Hashable]:
        """Keys of accepted groups not yet committed, oldest first."""
        return [key for _, key in self._buffered]

    @property
    def pending(self) -> bool:
        return bool(self._buffered)

    async def aclose(self) -> None:
        """Queue a final ``sink.flush``, wait for it and whatever ``on_commit`` queued after it, then stop
        the thread."""
        self._call(self.sink.flush, watermark=self._seq, cause="close")
        while self._futures:
            await asyncio.gather(*list(self._futures), return_exceptions=True)
        self._pool.shutdown(wait=True)

    def _call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        watermark: int | None,
        flush: bool = False,
        cause: str = "fill",
    ) -> None:
        fut = self._loop.run_in_executor(self._pool, fn, *args)
        self._futures.add(fut)
        fut.add_done_callback(lambda f: self._done(f, watermark, flush, cause))

    def _cause(self, cause: str, record: Any) -> str:
        """An ``add`` that committed fewer rows than the sink's ``flush_rows`` hit its age limit."""
        if cause == "fill" and isinstance(record, CommittedRows) and record.rows < self.sink.flush_rows:
            return "timer"
        return cause

    def _done(self, fut: asyncio.Future[Any], watermark: int | None, flush: bool, cause: str) -> None:
        """Runs on the loop thread. A truthy result commits every add up to ``watermark``."""
        self._futures.discard(fut)
        if flush:
            self._flush_inflight = False
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self.stats.write_errors += 1
            self._failures += 1
            logger.error("writer call failed (%d in a row): %r", self._failures, exc)
            if self._failures >= self.max_failures and self._on_fatal is not None:
                self._on_fatal(
                    RolloutFailureError(
                        f"{self._failures} consecutive trajectory writes failed; last error: {exc!r}"
                    )
                )
            return
        self._failures = 0
        if watermark is None or not fut.result():
            return
        self.stats.flushes += 1
        self.stats.flush_causes[self._cause(cause, fut.result())] += 1
        while self._buffered and self._buffered[0][0] <= watermark:
            self._buffered.popleft()
        if self._on_commit is not None:
            try:
                self._on_commit()
            except Exception:
                logger.exception("on_flush callback failed")
