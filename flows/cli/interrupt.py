"""What a command-line run (``rollflow run/resume``, ``python -m flows.async_rl``) does when Ctrl-C stops it.

What it is:
- ``quiet_interrupt_logs``: while a run is stopped by Ctrl-C, Prefect logs the ``KeyboardInterrupt`` it
  re-raises ("Engine execution interrupted by base exception", with the traceback) and its crash lines;
  this keeps them off the console (they still reach the Prefect API), so the user reads one line;
  the one line it prints instead says what was kept (``rollflow.trial.kept``).

The exit status is ``INTERRUPTED_STATUS`` (130 = 128 + SIGINT, the shell's convention).
What it is not: the stop itself: the flow stops its loops, the trainer writes its resume point and
the servers go (flows/async_rl.py); nothing here touches storage.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

INTERRUPTED_STATUS = 130


class _NoInterruptOnConsole(logging.Filter):
    """Drop console records about a ``KeyboardInterrupt`` (its traceback and Prefect's crash lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt) and "KeyboardInterrupt" not in record.getMessage()


@contextlib.contextmanager
def quiet_interrupt_logs() -> Iterator[None]:
    """Keep Ctrl-C's tracebacks and crash lines off the console handlers while the block runs."""
    quiet = _NoInterruptOnConsole()
    handlers = {
        h
        for name in ("", "prefect")
        for h in logging.getLogger(name).handlers
        if isinstance(h, logging.StreamHandler)
    }
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)
