"""A cancelled run's last line states its real end state (issue 21 §5), not ``Finished in state Running()``.

- The filter on hand-made records: only the last line of a run that logged "Flow run was cancelled."
  and still holds a non-final state is rewritten; every other line passes unchanged.
- The real thing (slow): an ``async-rl`` deployment run taken by a process worker (which owns the
  cancellation) from the session's Prefect server, cancelled while it runs as ``prefect flow-run cancel``
  does: the run ends Cancelled and its last line, in the API logs and the worker's output, says so.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.end_state import RealEndStateFilter

ROOT = Path(__file__).resolve().parents[2]


def _record(message: str, run_id: str | None) -> logging.LogRecord:
    record = logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, message, (), None)
    if run_id is not None:
        record.flow_run_id = run_id
    return record


def _through(f: RealEndStateFilter, message: str, run_id: str | None = "run-a") -> str:
    record = _record(message, run_id)
    assert f.filter(record)  # never drops a line
    return record.getMessage()


def test_only_a_cancelled_runs_non_final_last_line_is_rewritten() -> None:
    f = RealEndStateFilter()
    # a run that was not cancelled: its lines are its own
    assert _through(f, "Finished in state Running()", "run-b") == "Finished in state Running()"
    assert _through(f, "Flow run was cancelled.") == "Flow run was cancelled."
    assert _through(f, "Finished in state Running()", "run-b") == "Finished in state Running()"  # another run
    assert (
        _through(f, "Finished in state Running()") == "Finished in state Cancelled('Flow run was cancelled.')"
    )
    assert _through(f, "Finished in state Running()") == "Finished in state Running()"  # once per cancel
    # an engine that owns the cancellation (or a crash) already printed a final state: left alone
    _through(f, "Flow run was cancelled.", "run-c")
    assert _through(f, "Finished in state Crashed('x')", "run-c") == "Finished in state Crashed('x')"
    assert _through(f, "Finished in state Running()", None) == "Finished in state Running()"  # no run id


def _logs_of(flow_run_id: object) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
            sort=LogSort.TIMESTAMP_ASC,
        )
    return [log.message for log in logs if log.name == "prefect.flow_runs"]


def _wait(what: str, check: object, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s\n{log.read_text()[-4000:]}"
        time.sleep(1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cancelled_async_rl_run_ends_saying_cancelled(
    use_prefect_server: str,
    prefect_env: dict[str, str],
    stop_process_group: Callable[[subprocess.Popen[bytes]], None],
    tmp_path: Path,
) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    pool = f"end-state-{os.getpid()}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    # as prefect.yaml deploys it: the project directory is the working directory of the flow process
    async_rl = flow.from_source(source=str(ROOT), entrypoint="flows/async_rl.py:async_rl")
    async_rl.deploy(name=pool, work_pool_name=pool, build=False, push=False, print_next_steps=False)
    env = {k: v for k, v in prefect_env.items() if k != "PREFECT_LOGGING_EXTRA_LOGGERS"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", pool],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        overrides = [
            f"storage.root={tmp_path / 'storage'}",
            f"storage.local_cache={tmp_path / 'cache'}",
            "tracking.enabled=false",
            "train.steps=500",
        ]
        run = run_deployment(
            f"async-rl/{pool}",
            parameters={"config": "configs/tiny_cpu.yaml", "overrides": overrides},
            timeout=0,
        )
        _wait(
            "the trial's first lines", lambda: any(m.startswith("trial ") for m in _logs_of(run.id)), 300, log
        )
        time.sleep(3)  # into the servers' start or the loops
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)  # what `prefect flow-run cancel` does
            _wait("Cancelled", lambda: client.read_flow_run(run.id).state.is_final(), 180, log)
            assert client.read_flow_run(run.id).state.is_cancelled(), log.read_text()[-4000:]
        finished: list[str] = []

        def last_line_logged() -> bool:
            finished[:] = [m for m in _logs_of(run.id) if m.startswith("Finished in state")]
            return bool(finished)

        _wait("the last line", last_line_logged, 60, log)
        assert finished == ["Finished in state Cancelled('Flow run was cancelled.')"], finished
        assert "Finished in state Running()" not in log.read_text()
    finally:
        stop_process_group(worker)
