"""`ThreadedExecutor`: a `WorkflowExecutor` on its own event-loop thread, for synchronous callers.

What it is: the embedded single-process facade. ``start()`` runs the executor's loop in a daemon
thread; ``submit``/``wait``/``rollout_batch``/``prepare_batch`` run the executor's coroutines there and
block for their results; ``stop()`` closes the executor and joins the thread.

What it is not: a second scheduler. Every decision is the wrapped executor's; this only moves calls
across threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future as ConcurrentFuture
from typing import Any

from rollflow.rollout.executor import WorkflowExecutor
from storage.schema import TrajectoryGroup


class ThreadedExecutor:
    """See the module docstring."""

    def __init__(self, executor: WorkflowExecutor) -> None:
        self.executor = executor
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Run the executor's loop in a daemon thread; return once it is started."""
        if self._thread is not None:
            raise RuntimeError("executor thread already started")
        started = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            async def body() -> None:
                try:
                    await self.executor.astart()
                    self._loop = asyncio.get_running_loop()
                except BaseException as exc:
                    errors.append(exc)
                    raise
                finally:
                    started.set()
                await self.executor.wait_closed()  # set at the end of aclose(), called through stop()

            asyncio.run(body())

        self._thread = threading.Thread(target=main, name="rollout-executor", daemon=True)
        self._thread.start()
        started.wait()
        if errors:
            self._thread.join()
            self._thread = None
            raise errors[0]

    def _call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        if self._thread is None or self._loop is None:
            coro.close()
            raise RuntimeError("call start() first (or use the executor's async methods inside a loop)")
        fut: ConcurrentFuture = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def submit(self, data: dict[str, Any]) -> None:
        """Queue one row; its accepted group goes to the writer or to ``wait``."""
        self._call(self.executor.asubmit(data, track=False))

    def wait(self, count: int, timeout: float | None = None) -> list[TrajectoryGroup]:
        return self._call(self.executor.await_results(count, timeout))

    def rollout_batch(
        self, data_list: list[dict[str, Any]], timeout: float | None = None
    ) -> list[TrajectoryGroup]:
        return self._call(self.executor.arollout_batch(data_list), timeout)

    def prepare_batch(
        self, rows: Iterator[dict[str, Any]], batch_size: int, timeout: float | None = None
    ) -> list[TrajectoryGroup]:
        return self._call(self.executor.aprepare_batch(rows, batch_size, timeout))

    def stop(self, *, cancel: bool = True, timeout: float | None = 60.0) -> None:
        """Close the executor and join its thread (a no-op when not started)."""
        if self._thread is None:
            return
        self._call(self.executor.aclose(cancel=cancel), timeout)
        self._thread.join(timeout)
        self._thread = None
        self._loop = None
