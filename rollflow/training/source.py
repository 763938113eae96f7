"""Waiting for exactly ``n`` fresh trajectory groups from committed shards.

What it is: ``BatchCollector`` around a ``ShardSource`` (``rollflow.api.stores``: ``storage``'s
``ShardReader``, or a 10-line fake in tests). It polls until ``n`` groups that are fresh enough have
arrived, oldest first, sleeping on the stop event between polls (never a busy loop). Stale groups
(head_version below ``min_head_version``, the staleness rule's minimum trainable version) are consumed
and dropped by the reader and counted here; the reader also records them in storage as capacity credits
(``storage.credits``), so the rollout workers stop counting groups that will never be trained against
the staleness bound.
What it is not: a sampler or a shuffler; order is the reader's (commit time), and the reader's cursor
is the exactly-once state saved in resume points.

A wait fails with TrainerError when no new group arrived for ``timeout_s`` (the rollout side is dead
or stuck), or when ``max_read_failures`` reads in a row raised (storage down, not a hiccup: a failed
``take`` moves nothing, so it is simply retried); it returns None when the stop event is set. While
it waits it says so at INFO every ``report_every_s``: how many groups it still needs, the head version
they need, how long ago the last one came and when it will give up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.errors import TrainerError
from rollflow.api.stores import ShardSource

logger = logging.getLogger(__name__)


@dataclass
class Collected:
    """Exactly ``n`` groups plus what was consumed around them."""

    groups: list[Any]
    dropped_stale: int = 0
    quarantined: int = 0
    commit_latency_s: list[float] = field(default_factory=list)
    wait_s: float = 0.0


class BatchCollector:
    """Polls a reader until ``n`` fresh groups are in hand."""

    def __init__(
        self,
        reader: ShardSource,
        *,
        timeout_s: float,
        poll_interval_s: float = 0.2,
        max_poll_interval_s: float = 2.0,
        stop_event: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        report_every_s: float = 30.0,
        max_read_failures: int = 10,
    ) -> None:
        self.reader = reader
        self.report_every_s = report_every_s
        self.max_read_failures = max_read_failures
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.stop_event = stop_event or threading.Event()
        self._clock = clock

    def collect(self, n: int, *, min_head_version: int | None) -> Collected | None:
        """Block until ``n`` groups with head_version >= min_head_version are taken; None if stopped."""
        out = Collected(groups=[])
        start = last_progress = last_report = self._clock()
        interval = self.poll_interval_s
        failures = 0
        while len(out.groups) < n:
            if self.stop_event.is_set():
                logger.info(
                    "stop requested while waiting for data (%d/%d groups in hand)", len(out.groups), n
                )
                self._stranded(out)
                return None
            try:
                res = self.reader.take(n - len(out.groups), min_head_version=min_head_version)
            except Exception as e:  # storage I/O that outlasted the client's retries: take moved nothing
                failures += 1
                if failures >= self.max_read_failures:
                    raise TrainerError(
                        f"{failures} consecutive reads of trajectory shards failed; last error: {e!r}"
                    ) from e
                logger.warning("reading trajectory shards failed (%d in a row), retrying: %r", failures, e)
                self.stop_event.wait(interval)
                interval = min(self.max_poll_interval_s, interval * 1.5)
                continue
            failures = 0
            out.groups.extend(res.groups)
            out.dropped_stale += res.dropped_stale
            out.quarantined += res.quarantined
            out.commit_latency_s.extend(res.commit_latency_s)
            now = self._clock()
            if res.groups or res.dropped_stale:
                last_progress = now
                interval = self.poll_interval_s
                continue
            if now - last_progress > self.timeout_s:
                raise TrainerError(
                    f"no new trajectory group for {self.timeout_s:.0f}s ({len(out.groups)}/{n} in hand); "
                    "is the rollout loop running? (train.data_wait_timeout_s)"
                )
            if now - last_report >= self.report_every_s:
                last_report = now
                logger.info(
                    "trainer waiting for %d more trajectory group(s)%s (%d/%d in hand); last new group "
                    "%.0f s ago; gives up after %.0f s without one (train.data_wait_timeout_s)",
                    n - len(out.groups),
                    "" if min_head_version is None else f" with head_version >= {min_head_version}",
                    len(out.groups),
                    n,
                    now - last_progress,
                    self.timeout_s,
                )
            self.stop_event.wait(interval)
            interval = min(self.max_poll_interval_s, interval * 1.5)
        out.wait_s = self._clock() - start
        return out

    def _stranded(self, out: Collected) -> None:
        if out.groups:
            # These were consumed from the live cursor but will not be trained on in this process. The
            # resume point written at shutdown uses the cursor of the last completed step (see trainer),
            # so a restart takes them again.
            logger.info("%d group(s) taken but untrained at stop; a restart re-reads them", len(out.groups))
