"""Flushing Prefect's log and event queues works where an event loop runs (a notebook kernel): no
``coroutine ... was never awaited`` warning, and the queued work is really sent (flows/local_api.py)."""

from __future__ import annotations

import asyncio
import gc
import warnings

from flows.local_api import _drain_prefect_queues


def test_draining_inside_a_running_loop_waits_instead_of_leaving_a_coroutine() -> None:
    from prefect.logging.handlers import APILogWorker

    async def in_a_kernel() -> None:  # a notebook cell runs inside the kernel's loop
        APILogWorker.instance()  # a live worker with a queue to drain (nothing in it)
        _drain_prefect_queues(timeout_s=5.0)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        asyncio.run(in_a_kernel())
        gc.collect()
    never_awaited = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert never_awaited == [], never_awaited
