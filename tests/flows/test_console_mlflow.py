"""The summary's last lines say how to open the run in MLflow (flows/console.py ``mlflow_lines``): the exact
``mlflow ui --backend-store-uri ...`` command for a SQLite store, the server's URL when the run used one
(real HTTP servers on 127.0.0.1 here), and a warning when the UI meant by ``ROLLFLOW_MLFLOW_UI_URL`` is
not there."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.console import UI_PORT, UI_URL_ENV, healthy, mlflow_lines

ROOT = Path(__file__).resolve().parents[2]

RUN = "http://127.0.0.1:5000/#/experiments/3/runs/abc"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _dead_url() -> str:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    port = httpd.server_address[1]
    httpd.server_close()  # nothing listens there any more
    return f"http://127.0.0.1:{port}"


def test_a_sqlite_store_gets_the_exact_ui_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UI_URL_ENV, raising=False)
    lines = mlflow_lines("sqlite:////work/x/runs/mlflow/mlflow.db", RUN)
    assert "logged to a file, not a server" in lines[0]
    assert lines[1].strip().startswith("MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false ")
    assert lines[1].endswith(
        "mlflow ui --backend-store-uri sqlite:////work/x/runs/mlflow/mlflow.db --port 5000"
    )
    assert lines[2].strip() == "then http://127.0.0.1:5000/#/experiments/3/runs/abc"


def test_a_meant_ui_that_answers_is_linked_one_that_does_not_is_named(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UI_URL_ENV, server)
    assert mlflow_lines("sqlite:///runs/mlflow/mlflow.db", RUN) == [
        f"MLflow:  {server}/#/experiments/3/runs/abc"
    ]
    dead = _dead_url()
    monkeypatch.setenv(UI_URL_ENV, dead)
    lines = mlflow_lines("sqlite:///runs/mlflow/mlflow.db", RUN)
    assert lines[0].startswith(f"MLflow:  nothing answers at {dead}") and "--backend-store-uri" in lines[1]


def test_a_tracking_server_is_linked_and_a_gone_one_is_said(server: str) -> None:
    run = f"{server}/#/experiments/3/runs/abc"
    assert mlflow_lines(server, run) == [f"MLflow:  {run}"]
    dead = _dead_url()
    assert mlflow_lines(dead, f"{dead}/#/experiments/3/runs/abc")[0].endswith(
        "(the server does not answer now)"
    )


@pytest.mark.slow
def test_the_printed_ui_command_runs_as_printed_without_the_job_runner(tmp_path: Path) -> None:
    """The line runs in a shell as printed (on a free port); the UI answers and starts no job consumers."""
    import signal
    import subprocess
    import time

    import psutil

    from infra.servers import free_port

    db = tmp_path / "mlflow.db"
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    mlflow.search_experiments()  # creates the store
    line = mlflow_lines(f"sqlite:///{db}", RUN)[1].strip()
    port = free_port("127.0.0.1")
    line = line.replace(f"--port {UI_PORT}", f"--port {port}")
    proc = subprocess.Popen(["bash", "-c", line], start_new_session=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not healthy(f"http://127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline, "the UI did not start"
            time.sleep(0.5)
        time.sleep(2)  # let it start whatever it starts
        group = [p for p in psutil.process_iter() if _pgid(p.pid) == proc.pid]
        names = [" ".join(p.cmdline()[:4]) for p in group]
        assert not any("huey" in n for n in names) and len(group) <= 8, names  # 15 with the job runner
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
