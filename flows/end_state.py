"""The last line of a cancelled flow run states its real end state, not ``Finished in state Running()``.

Why: when a worker or ``flow.serve`` runner cancels a deployment run, it owns the cancellation. It tells
the flow process (Prefect's control channel), sends SIGTERM, and proposes Cancelled itself once the process
has exited. The engine in the flow process therefore logs "Flow run was cancelled." and leaves the run's
state alone, and its last line prints the state it still holds: ``Finished in state Running()``, in the
console and in the run's logs in the UI, while the run ends Cancelled (seen on every cancel of
``async-rl/local``; a plain flow served by a runner does the same).

What it is: ``state_real_end_states()``, a filter on Prefect's ``prefect.flow_runs`` logger, installed
once per process by the flows. For a flow run that logged "Flow run was cancelled." it rewrites that run's
``Finished in state <not final>()`` line into ``Finished in state Cancelled('Flow run was cancelled.')``,
the line an engine that owns the cancellation prints (a run cancelled in its own process, or a subflow).
Every other line, and every line of a run that was not cancelled, goes through unchanged; states are
never touched, only the words of that one line.
What it is not: the cancellation itself (Prefect's runner and engine), nor the loops' shutdown.
"""

from __future__ import annotations

import logging
import threading

CANCELLED_LINE = "Flow run was cancelled."  # Prefect's engine, when the runner's intent is "cancel"
FINISHED_PREFIX = "Finished in state "
_NOT_FINAL = ("Running(", "Pending(", "Scheduled(", "Cancelling(")
_FLOW_RUN_LOGGER = "prefect.flow_runs"


class RealEndStateFilter(logging.Filter):
    """Rewrites the last line of a cancelled run whose engine left its state non-final (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._cancelled: set[str] = set()  # flow run ids that logged CANCELLED_LINE
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        run_id = str(getattr(record, "flow_run_id", "") or "")
        if not run_id:
            return True
        message = record.getMessage()
        if message == CANCELLED_LINE:
            with self._lock:
                self._cancelled.add(run_id)
        elif message.startswith(FINISHED_PREFIX) and message[len(FINISHED_PREFIX) :].startswith(_NOT_FINAL):
            with self._lock:
                cancelled = run_id in self._cancelled
                self._cancelled.discard(run_id)
            if cancelled:
                record.msg = f"{FINISHED_PREFIX}Cancelled({CANCELLED_LINE!r})"
                record.args = ()
        return True


def state_real_end_states() -> RealEndStateFilter:
    """Install the filter on ``prefect.flow_runs`` (once per process); returns it."""
    logger = logging.getLogger(_FLOW_RUN_LOGGER)
    for f in logger.filters:
        if isinstance(f, RealEndStateFilter):
            return f
    f = RealEndStateFilter()
    logger.addFilter(f)
    return f
