"""WorkflowExecutor: runs rollout episodes concurrently on one event loop, within the staleness capacity.

What it is: AReaL's WorkflowExecutor as one asyncio scheduler task. Per tick it (1) starts episodes
while ``StalenessManager.try_submit`` grants capacity and it is not paused, taking ``asubmit``-ted rows
first, then pulling lazily from a ``feed``-ed source (a data cursor moves only when an episode starts);
(2) commits the writer's buffer at once when nothing more can be admitted (``_gate_closed``: the trainer
may be waiting for exactly those groups, so a shard that never fills must not wait for its timer); (3)
waits for an episode to finish, or ``poll_interval_s`` (a new version re-opens capacity); (4) judges
each finished episode:
- failed   -- ``arun_episode`` raised or returned a malformed group: counted and logged; above
              ``max_failure_rate`` (after ``min_episodes_for_failure``) -> ``RolloutFailureError``
              quoting the first traceback;
- skipped  -- before it starts: the ``prompt_filter`` (``rollflow.rollout.prompt_filter``) says the
              prompt's last group was all solved or all unsolved; released at once, never generated;
- rejected -- None, an empty group, ``should_accept_fn(group)`` is False, or stale
              (``StalenessManager.is_stale``: the oldest-first trainer would drop it anyway);
- accepted -- handed to the shard writer (``OrderedWriter``: one worker thread, in order) and/or
              returned to callers.
Every episode that finished in a tick is judged before the failure rate is checked, so a
``RolloutFailureError`` never leaves finished episodes unjudged.

Drive it inside a loop: ``async with executor:``, then ``feed``/``asubmit``/``arollout_batch``/
``await_results``/``await_idle``.

What it is not: no datasets, storage layout or checkpoints (``rollflow.rollout.loop``), no trajectory
building (the workflows), no verdicts on finished episodes (``episode_judge``), no counters
(``executor_stats``), no writer bookkeeping (``ordered_writer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from rollflow.api.errors import RolloutFailureError
from rollflow.api.inference import InferenceClient
from rollflow.api.stores import ShardSink
from rollflow.api.workflow import RolloutWorkflow, import_string
from rollflow.rollout.collected import CollectedGroups
from rollflow.rollout.episode_inputs import EpisodeInputs
from rollflow.rollout.episode_judge import (
    ShouldAcceptFn,
    check_failure_rate,
    finished_group,
    record_failure,
    reject_reason,
)
from rollflow.rollout.executor_stats import ExecutorStats
from rollflow.rollout.ordered_writer import OrderedWriter
from rollflow.rollout.partials import EPISODE_KEY
from rollflow.rollout.prompt_filter import PromptCurriculum
from rollflow.rollout.prompt_review import PromptReview
from rollflow.rollout.staleness import StalenessManager
from storage.schema import TrajectoryGroup

logger = logging.getLogger(__name__)


@dataclass
class _Episode:
    key: Hashable
    started_at: float
    future: asyncio.Future[TrajectoryGroup | None] | None = None


class WorkflowExecutor:
    """Concurrent, staleness-bounded episode runner; see the module docstring."""

    def __init__(
        self,
        workflow: RolloutWorkflow,
        client: InferenceClient,
        staleness: StalenessManager,
        *,
        writer: ShardSink | None = None,
        version_fn: Callable[[], int] | None = None,
        should_accept_fn: ShouldAcceptFn | str | None = None,
        max_failure_rate: float = 0.2,
        min_episodes_for_failure: int = 20,
        poll_interval_s: float = 0.05,
        max_write_failures: int = 5,
        on_flush: Callable[[WorkflowExecutor], None] | None = None,
        collect: bool | None = None,
        prompt_filter: PromptCurriculum | None = None,
        review: PromptReview | None = None,
        on_episode_end: Callable[[Hashable], None] | None = None,
    ) -> None:
        """``writer`` gets accepted groups (calls made in order on one worker thread); ``version_fn``
        defaults to ``client.get_version``; ``should_accept_fn`` is ``fn(group) -> bool`` or its import
        string; the executor stops when more than ``max_failure_rate`` of at least
        ``min_episodes_for_failure`` finished episodes raised, or after ``max_write_failures`` failed
        writer calls in a row; ``poll_interval_s`` bounds the wait between capacity checks (a new
        version re-opens capacity); ``on_flush(executor)`` runs on the loop thread after each commit;
        ``collect`` keeps accepted groups for ``await_results`` (default: when no writer);
        ``prompt_filter`` skips fed rows (by ``data["prompt_id"]``) before they start; ``review``
        replaces a share of the fed rows that start with solved prompts that are due;
        ``on_episode_end(key)`` runs as each episode ends (a ``PartialKeepingClient``'s ``forget``).
        """
        if not 0 < max_failure_rate <= 1:
            raise ValueError(f"max_failure_rate must be in (0, 1], got {max_failure_rate}")
        self.workflow, self.client, self.staleness, self.writer = workflow, client, staleness, writer
        self._version_fn = version_fn or client.get_version
        self.on_episode_end = on_episode_end
        if isinstance(should_accept_fn, str):
            should_accept_fn = import_string(should_accept_fn)
        self._should_accept = should_accept_fn
        self.max_failure_rate, self.min_episodes_for_failure = max_failure_rate, min_episodes_for_failure
        self.poll_interval_s, self.max_write_failures = poll_interval_s, max_write_failures
        self._on_flush = on_flush
        self._collect = writer is None if collect is None else collect
        self.prompt_filter, self.review = prompt_filter, review
        self.stats = ExecutorStats()

        # Loop-thread state (only touched from the loop once started).
        self._inputs = EpisodeInputs(staleness, self.stats, prompt_filter, review)
        self._tasks: dict[asyncio.Task[TrajectoryGroup | None], _Episode] = {}
        self._out: OrderedWriter | None = None  # the writer's calls, in order, off the loop (astart)
        self._next_key = 0
        self._cancelled_keys: list[Hashable] = []  # cancelled by aclose(): never finished, still open
        self._closing = False
        self._results = CollectedGroups()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._paused = threading.Event()

    # --- lifecycle (async) -----------------------------------------------------------------------------

    async def __aenter__(self) -> WorkflowExecutor:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose(cancel=True)

    async def astart(self) -> None:
        """Start the scheduler on the running loop."""
        if self._scheduler is not None:
            raise RuntimeError("executor already started")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.writer is not None:
            self._out = OrderedWriter(
                self.writer,
                self._loop,
                self.stats,
                max_failures=self.max_write_failures,
                on_commit=(lambda: self._on_flush(self)) if self._on_flush is not None else None,
                on_fatal=self._on_write_fatal,
            )
        self.stats.started_at = time.monotonic()
        self._scheduler = asyncio.create_task(self._run_scheduler(), name="rollout-scheduler")

    async def aclose(self, *, cancel: bool = True) -> None:
        """Stop admitting; cancel running episodes (or let them finish if ``cancel=False``); flush."""
        if self._scheduler is None:
            return
        if not cancel:
            self._inputs.clear()
            with contextlib.suppress(RolloutFailureError):
                await self.await_idle()
        self._closing = True
        self._poke()
        with contextlib.suppress(asyncio.CancelledError):
            await self._scheduler
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        futures = self._inputs.clear()
        for ep in self._tasks.values():
            self._cancelled_keys.append(ep.key)
            self.stats.cancelled += 1
            self.staleness.on_rollout_rejected()
            futures.append(ep.future)
        self._tasks.clear()
        for fut in futures:
            if fut is not None and not fut.done():
                fut.cancel()
        if self._out is not None:
            await self._out.aclose()  # the final flush, then whatever on_flush queued after it
        self._fail_waiters(self._error or RuntimeError("executor closed"))

    # --- feeding and collecting (async, on the loop) ---------------------------------------------------

    def feed(self, source: Iterator[tuple[Hashable, dict[str, Any]] | None]) -> None:
        """Pull ``(key, row)`` pairs from ``source`` whenever capacity allows (after submitted rows).

        A ``None`` from ``source`` means "nothing may start now": the executor asks again on a later tick.
        """
        self._inputs.feed(source)
        self._poke()

    def feed_rows(self, rows: Iterator[dict[str, Any]]) -> None:
        """``feed`` for plain rows; keys are a running counter."""
        self.feed((self._new_key(), row) for row in rows)

    async def asubmit(self, data: dict[str, Any], *, key: Hashable | None = None, track: bool = True) -> Any:
        """Queue one row. ``track``: return a future of its accepted group or None (rejected/failed);
        else return None and let the group go to the writer / ``await_results`` like a fed row."""
        self._check_running()
        assert self._loop is not None
        fut: asyncio.Future[TrajectoryGroup | None] | None = self._loop.create_future() if track else None
        self._inputs.submit(self._new_key() if key is None else key, data, fut)
        self._poke()
        return fut

    async def arollout_batch(self, data_list: list[dict[str, Any]]) -> list[TrajectoryGroup]:
        """Synchronous-RL step: run one episode per row, wait for all, return the accepted groups in order."""
        futures = [await self.asubmit(d) for d in data_list]
        results = await asyncio.gather(*futures)
        return [g for g in results if g is not None]

    async def await_results(self, count: int, timeout: float | None = None) -> list[TrajectoryGroup]:
        """Pop ``count`` collected groups (oldest accepted first); TimeoutError if they do not arrive."""
        if not self._collect:
            raise RuntimeError("this executor does not collect results (collect=False)")
        self._check_running()
        return await self._results.take(count, timeout)

    async def await_idle(self) -> None:
        """Wait until nothing is queued, the source is exhausted and no episode runs."""
        self._check_running()
        if self._is_idle():
            return
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._idle_waiters.append(fut)
        await fut

    # --- control (any thread) --------------------------------------------------------------------------

    def pause(self) -> None:
        """Start no new episode until ``resume`` (running ones go on)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._poke()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    @property
    def n_running(self) -> int:
        return len(self._tasks)

    def open_keys(self) -> list[Hashable]:
        """Keys of episodes not yet committed: taken from the source but not started, running, cancelled
        by close, or still buffered."""
        running = [ep.key for ep in self._tasks.values()]
        queued = self._inputs.queued_keys()
        buffered = self._out.buffered_keys() if self._out is not None else []
        return queued + running + self._cancelled_keys + buffered

    def cancelled_keys(self) -> list[Hashable]:
        """Keys of the episodes ``aclose`` cancelled while they ran (open: never judged)."""
        return list(self._cancelled_keys)

    def submit_io(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the writer thread after the writer calls queued so far (loop thread only)."""
        if self._out is None:
            raise RuntimeError("submit_io needs an executor with a writer, started")
        self._out.submit(fn, *args)

    # --- the scheduler ---------------------------------------------------------------------------------

    def _new_key(self) -> int:
        self._next_key += 1
        return self._next_key

    def _check_running(self) -> None:
        self.raise_if_failed()
        if self._scheduler is None or self._closing:
            raise RuntimeError("executor is not running")

    def _poke(self) -> None:
        """Wake the scheduler (from any thread)."""
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._wake.set)

    def _is_idle(self) -> bool:
        return not self._tasks and not self._inputs

    async def _run_scheduler(self) -> None:
        assert self._wake is not None
        try:
            while not self._closing:
                self.raise_if_failed()
                self._admit()
                # nothing more can come until the trainer moves: commit now, not when the timer says so
                self._flush(force=self._gate_closed())
                await self._wait_for_progress()
                if self._is_idle():
                    self._resolve(self._idle_waiters, None)
                    self._idle_waiters = []
        except Exception as exc:  # the source raised, or too many episodes failed
            if self._error is None:
                self._error = exc
            logger.error("rollout executor stopped: %s", exc)
            self._fail_waiters(exc)

    def _admit(self) -> None:
        if self._paused.is_set():
            return
        version = int(self._version_fn())
        while self._inputs and self.staleness.get_capacity(version) > 0:
            item = self._inputs.next(version)
            if item is None:
                break
            if not self.staleness.try_submit(version):  # capacity changed under us (another thread)
                self._inputs.put_back(item)
                break
            key, data, fut = item
            ctx = contextvars.copy_context()  # the episode's requests know their prompt (rollout.partials)
            ctx.run(EPISODE_KEY.set, key)
            task = asyncio.create_task(self.workflow.arun_episode(self.client, data), context=ctx)
            now = time.monotonic()
            if not self._tasks:
                self.stats.busy_since = now
            self._tasks[task] = _Episode(key=key, started_at=now, future=fut)
            self.stats.started += 1

    async def _wait_for_progress(self) -> None:
        assert self._wake is not None
        self._wake.clear()
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait(
                [*self._tasks, waker], timeout=self.poll_interval_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not waker.done():
                waker.cancel()
        finished = [t for t in done if t is not waker]
        for task in sorted(finished, key=lambda t: self._tasks[t].started_at):
            self._finish(task)  # every finished episode is judged before the failure rate is checked
        check_failure_rate(
            self.stats, max_failure_rate=self.max_failure_rate, min_episodes=self.min_episodes_for_failure
        )

    def _finish(self, task: asyncio.Task[TrajectoryGroup | None]) -> None:
        ep = self._tasks.pop(task)
        if self.on_episode_end is not None:
            self.on_episode_end(ep.key)
        if not self._tasks and self.stats.busy_since is not None:
            self.stats.busy_s += time.monotonic() - self.stats.busy_since
            self.stats.busy_since = None
        try:
            group = finished_group(task)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            self.staleness.on_rollout_rejected()
            self._resolve([ep.future], None)
            return
        except Exception as exc:
            self._on_failure(ep, exc)
            return
        version = int(self._version_fn())
        if group is not None:
            self.stats.record_generated(group)
            if self.prompt_filter is not None and group.rows:
                self.prompt_filter.observe(group.prompt_id, group.rewards)
            if self.review is not None and group.rows:
                self.review.observe(group.prompt_id, group.rewards, version)
        reason = reject_reason(
            group, should_accept=self._should_accept, staleness=self.staleness, version=version
        )
        if reason is not None:
            self.stats.rejected[reason] += 1
            self.staleness.on_rollout_rejected()
            logger.debug("episode %s rejected (%s)", ep.key, reason)
            self._resolve([ep.future], None)
            return
        assert group is not None
        self._accept(ep, group, version)

    def _accept(self, ep: _Episode, group: TrajectoryGroup, version: int) -> None:
        self.staleness.on_rollout_accepted()
        self.stats.record_accepted(group, version)
        if self._out is not None:
            self._out.add(group, ep.key)
        if ep.future is not None:
            self._resolve([ep.future], group)
        elif self._collect:
            self._results.add(group)

    def _on_failure(self, ep: _Episode, exc: BaseException) -> None:
        record_failure(self.stats, ep.key, exc)
        self.staleness.on_rollout_rejected()
        self._resolve([ep.future], None)

    def _gate_closed(self) -> bool:
        """Accepted groups wait in the writer's buffer and nothing can add to it: no episode runs after
        ``_admit`` (paused, no capacity under the staleness bound, or the source holds back). The trainer
        may need exactly those groups to make the step that re-opens the bound, so waiting for the buffer
        to fill (or for its timer) would stall both sides. (Episodes still running will add to it: a
        flush per finished group would write a shard per group, so those wait for the last one.)"""
        return self._out is not None and self._out.pending and not self._tasks

    @property
    def buffered(self) -> bool:
        """Accepted groups not yet committed by the writer."""
        return self._out is not None and self._out.pending

    def _flush(self, *, force: bool) -> None:
        """Queue a ``maybe_flush`` (or ``flush``) on the writer thread unless one is in flight."""
        if self._out is not None:
            self._out.flush(force=force)

    def _on_write_fatal(self, exc: BaseException) -> None:
        """Too many writer calls failed in a row: stop the executor with ``exc`` (loop thread)."""
        if self._error is None:
            self._error = exc
            self._fail_waiters(exc)
            self._poke()

    @staticmethod
    def _resolve(futures: list[asyncio.Future | None], value: Any) -> None:
        for fut in futures:
            if fut is not None and not fut.done():
                fut.set_result(value)

    def _fail_waiters(self, exc: BaseException) -> None:
        self._results.fail(exc)
        for fut in self._idle_waiters + [ep.future for ep in self._tasks.values()]:
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        self._idle_waiters = []
