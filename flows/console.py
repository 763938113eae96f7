"""What a command-line run prints: the run's milestones, not Prefect's bookkeeping.

What it is: ``run_console(verbose=...)``, the context a command-line run (``rollflow run``/``resume``,
``python -m flows.async_rl``, ``make demo``) runs its flow in:

- by default the console drops the task runs' ``Finished in state Completed()`` lines (a task that ends
  in any other state is still shown); the Prefect API keeps every line (the UI, ``prefect flow-run logs``).
  What is left is the run's story: the trial, the layout, "before", a line per 10 % of training
  (``tasks/progress.py``), "after", the registry decision, warnings and errors;
- ``verbose``: the core's loggers (``rollflow``, ``storage``, ``infra``) and the flow and task run
  loggers log at DEBUG, on the console and in the API: every step, checkpoint and weight load, and the
  resolved config (not the line per reward call: ``PER_CALL_LOGGERS`` stay at INFO).

Everything is put back on exit. What it is not: the level of a line (each module chooses INFO or DEBUG)
nor the progress lines and bar (``tasks/progress.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
PER_CALL_LOGGERS = ("rollflow.rewards.runner",)  # a line per completion scored: too many even for -v
VERBOSE_HELP = "log every step, checkpoint and weight load, and the resolved config (DEBUG)"


class _NoCompletedTaskLines(logging.Filter):
    """Drop a task run's "Finished in state Completed()" record (the flow run's own is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name == "prefect.task_runs"
            and record.getMessage().startswith("Finished in state Completed")
        )


def _console_handlers() -> set[logging.Handler]:
    return {
        h
        for name in ("", "prefect")
        for h in logging.getLogger(name).handlers
        if isinstance(h, logging.StreamHandler)
    }


@contextlib.contextmanager
def run_console(*, verbose: bool = False) -> Iterator[None]:
    """See the module docstring."""
    from tasks.runtime import CORE_LOGGERS

    quiet = _NoCompletedTaskLines()
    handlers = _console_handlers()
    for h in handlers:
        h.addFilter(quiet)
    levels = {
        name: logging.getLogger(name).level for name in (*CORE_LOGGERS, *RUN_LOGGERS, *PER_CALL_LOGGERS)
    }
    if verbose:
        for name in levels:
            logging.getLogger(name).setLevel(logging.INFO if name in PER_CALL_LOGGERS else logging.DEBUG)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
