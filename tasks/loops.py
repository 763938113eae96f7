"""Joining a run's long-lived loops, and saying which one failed and why.

What it is: ``join_loops(futures, stop)``: waits for the primary loop (the trainer: the run ends with
it), then sets ``stop`` so the other loops end, then waits for them. A loop that raised becomes a
``LoopFailedError`` that names it, quotes its error (chained as ``__cause__``) and says where the trainer
stopped. Every loop sets ``stop`` when it fails, so the others stop soon after: the trainer finishes
its step, writes a resume point and returns ``stopped``; the rollout and eval loops return.

The main thread waits in slices of ``WAKE_S``: a SIGTERM the kernel hands to a loop's thread only runs
Prefect's handler (the graceful stop) when the main thread next runs Python, and a wait with no timeout
would hold it until the trainer finished on its own.

A cancelled loop (``tasks.runtime.is_interruption``) is re-raised as it is when no loop failed, so the
run ends Cancelled. When several loops raised, the first failure in ``CAUSE_ORDER`` is reported (a trainer that timed out
waiting for data is a consequence of a dead rollout, not the cause) and the others are named after it.

What it is not: a scheduler (the flow submits the loops) or a retry policy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger
from prefect.exceptions import CancelledRun
from prefect.futures import PrefectFuture

from rollflow.api.errors import LoopFailedError
from tasks.runtime import is_interruption

CAUSE_ORDER = ("rollout-loop", "eval-loop", "train-loop")
WAKE_S = 0.25  # how late a signal delivered to another thread may run its handler in the main thread


def wait_interruptibly(fut: PrefectFuture[Any], wake_s: float = WAKE_S) -> None:
    """Return once ``fut`` is done, waking every ``wake_s`` so pending signal handlers run (see above)."""
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    while not done.wait(wake_s):
        pass


def join_loops(
    futures: Mapping[str, PrefectFuture[Any]], stop: threading.Event, *, primary: str = "train-loop"
) -> dict[str, Any]:
    """Results by loop name; raises ``LoopFailedError`` for the loop that failed (see the module docstring)."""
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def join(name: str) -> None:
        fut = futures[name]
        try:
            wait_interruptibly(fut)
            results[name] = fut.result()
        except BaseException as e:  # noqa: BLE001 (re-raised below as LoopFailedError, or as is)
            state = getattr(fut, "state", None)
            if state is not None and state.is_cancelled():
                # A loop stopped early ends Cancelled with its summary as data (tasks.runtime.interrupted);
                # reading such a state raises whatever Prefect makes of that data, so keep the summary and
                # record the loop as cancelled, not failed.
                data = _cancelled_data(fut)
                if data is not None:
                    results[name] = data
                errors[name] = e if is_interruption(e) else CancelledRun(state.message or f"{name} cancelled")
            else:
                errors[name] = e

    try:
        join(primary)
    finally:
        stop.set()
    for name in futures:
        if name != primary:
            join(name)
    if errors:
        _raise_for(errors, results.get(primary))
    return results


def _raise_for(errors: dict[str, BaseException], trained: Any) -> None:
    """Raise what the run ends with: an interruption as it is, else a ``LoopFailedError`` for the cause."""
    for e in errors.values():
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise e
    # A loop that was cancelled (Ctrl-C, SIGTERM, a cancel from the UI) is not a failure: when no loop
    # really failed the run ends Cancelled, and a real failure is reported over the cancellations it caused.
    interruptions = [e for e in errors.values() if is_interruption(e)]
    errors = {n: e for n, e in errors.items() if not is_interruption(e)}
    if not errors:
        raise interruptions[0]
    order = [n for n in CAUSE_ORDER if n in errors] + [n for n in errors if n not in CAUSE_ORDER]
    name, err = order[0], errors[order[0]]
    message = f"{type(err).__name__}: {err}"
    if isinstance(trained, Mapping) and "final_version" in trained:
        how = "wrote its resume point" if trained.get("stopped") else "had finished"
        message += f"; the trainer stopped at version {trained['final_version']} and {how}"
    for other in order[1:]:
        message += f"; {other} also failed: {type(errors[other]).__name__}: {errors[other]}"
    get_run_logger().error("%s failed: %s", name, message)
    raise LoopFailedError(name, message) from err


def _cancelled_data(fut: PrefectFuture[Any]) -> Mapping[str, Any] | None:
    """The summary a loop returned with its Cancelled state (``tasks.runtime.interrupted``), else None."""
    state = getattr(fut, "state", None)
    if state is None:
        return None
    try:
        data = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 (no readable data: nothing to report)
        return None
    return data if isinstance(data, Mapping) else None
