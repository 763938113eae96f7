"""flows/console.py: a command-line run's console drops the task runs' Completed lines (nothing else), and
``-v`` turns the core's and the run loggers' DEBUG on for the run only."""

from __future__ import annotations

import logging

from flows.console import PER_CALL_LOGGERS, RUN_LOGGERS, _NoCompletedTaskLines, run_console
from tasks.runtime import CORE_LOGGERS


def _record(name: str, msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_only_completed_task_run_lines_are_dropped() -> None:
    quiet = _NoCompletedTaskLines()
    assert not quiet.filter(_record("prefect.task_runs", "Finished in state Completed()"))
    assert quiet.filter(_record("prefect.task_runs", "Finished in state Cancelled('stopped')"))
    assert quiet.filter(_record("prefect.task_runs", "Finished in state Failed('boom')", logging.ERROR))
    assert quiet.filter(_record("prefect.flow_runs", "Finished in state Completed()"))  # the run's own end
    assert quiet.filter(_record("prefect.task_runs", "eval before: accuracy 0.210"))


def test_the_console_filter_and_verbose_levels_last_for_the_run_only() -> None:
    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    names = (*CORE_LOGGERS, *RUN_LOGGERS, *PER_CALL_LOGGERS)
    before = {n: logging.getLogger(n).level for n in names}
    try:
        with run_console():
            assert any(isinstance(f, _NoCompletedTaskLines) for f in handler.filters)
            assert {n: logging.getLogger(n).level for n in names} == before  # default: levels untouched
        assert not handler.filters
        with run_console(verbose=True):
            assert all(logging.getLogger(n).level == logging.DEBUG for n in (*CORE_LOGGERS, *RUN_LOGGERS))
            assert all(logging.getLogger(n).level == logging.INFO for n in PER_CALL_LOGGERS)
        assert {n: logging.getLogger(n).level for n in names} == before
    finally:
        root.removeHandler(handler)
