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

Everything is put back on exit. ``mlflow_lines`` writes the summary's last lines: how to open this run
in MLflow's UI (the exact ``mlflow ui --backend-store-uri ...`` command for a SQLite store, the server's
URL when the run used one, and a warning when a server was meant but does not answer).
What it is not: the level of a line (each module chooses INFO or DEBUG) nor the progress lines and bar
(``tasks/progress.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from flows.local_api import healthy

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


UI_URL_ENV = "ROLLFLOW_MLFLOW_UI_URL"  # where a UI on a SQLite store is meant to be (docs/operations.md)
UI_PORT = 5000  # `mlflow ui`'s default port


def _mlflow_command() -> str:
    """The ``mlflow`` of this environment, relative to the working directory when it lies below it."""
    exe = Path(sys.executable).parent / "mlflow"
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def mlflow_lines(tracking_uri: str | None, run_url: str | None) -> list[str]:
    """How to open the run ``run_url`` (``.../#/experiments/E/runs/R``) logged to ``tracking_uri``."""
    if not tracking_uri or not run_url or "#/" not in run_url:
        return [f"MLflow:  {run_url or '-'}"]
    page = "#/" + run_url.split("#/", 1)[1]
    if tracking_uri.startswith("http"):
        url = f"{tracking_uri.rstrip('/')}/{page}"
        return [f"MLflow:  {url}" + ("" if healthy(tracking_uri) else "  (the server does not answer now)")]
    meant = os.environ.get(UI_URL_ENV)
    if meant and healthy(meant):
        return [f"MLflow:  {meant.rstrip('/')}/{page}"]
    head = (
        f"MLflow:  nothing answers at {meant} (${UI_URL_ENV}); open this run with MLflow's UI on its store:"
        if meant
        else "MLflow:  the run was logged to a file, not a server; open it with MLflow's UI:"
    )
    return [
        head,
        # without the job runner MLflow's UI is 7 processes, not 15 (its huey consumers)
        f"  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false {_mlflow_command()} ui --backend-store-uri {tracking_uri} "
        f"--port {UI_PORT}",
        f"  then http://127.0.0.1:{UI_PORT}/{page}",
    ]
