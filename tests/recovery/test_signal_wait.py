"""A SIGTERM the kernel hands to a loop's thread still stops the run at once (``tasks.loops``).

CPython runs a signal's Python handler in the main thread, the next time it runs Python. Prefect's
graceful stop is such a handler. The kernel may deliver a process's SIGTERM to any thread: when it went to
a training thread while the main thread sat in a wait with no timeout, the handler ran only once the
trainer had finished on its own (seen once in the kill audit: the stop landed, the run trained to its last
step, then died of the signal). Here the signal goes to the worker thread on purpose, with
``pthread_kill``, against a real Prefect future.
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest
from prefect.futures import PrefectConcurrentFuture

from tasks.loops import wait_interruptibly


class _Stopped(BaseException):
    pass


@pytest.fixture()
def sigusr1_raises() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGUSR1, handler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_a_signal_sent_to_a_loops_thread_interrupts_the_main_threads_wait(sigusr1_raises: None) -> None:
    release, started = threading.Event(), threading.Event()
    worker: dict[str, int] = {}

    def loop() -> str:  # a long-lived loop: busy until released (or 30 s, so the test cannot hang)
        worker["ident"] = threading.get_ident()
        started.set()
        release.wait(30.0)
        return "done"

    with cf.ThreadPoolExecutor(1) as pool:
        inner = pool.submit(loop)
        fut = PrefectConcurrentFuture(uuid.uuid4(), inner)
        assert started.wait(10.0)
        threading.Timer(0.2, signal.pthread_kill, (worker["ident"], signal.SIGUSR1)).start()
        try:
            with pytest.raises(_Stopped):
                wait_interruptibly(fut)
            assert not release.is_set() and not inner.done()  # the loop was still running
        finally:
            release.set()


def test_it_returns_when_the_future_is_done() -> None:
    with cf.ThreadPoolExecutor(1) as pool:
        inner = pool.submit(lambda: 7)
        wait_interruptibly(PrefectConcurrentFuture(uuid.uuid4(), inner), wake_s=0.05)
        assert inner.done() and inner.result() == 7
