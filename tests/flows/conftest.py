"""A real Prefect server on 127.0.0.1 (SQLite under a temp PREFECT_HOME), once per test session.

Flow tests talk to it through PREFECT_API_URL; the deployment test also starts a process worker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_process(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace_s`` (Prefect workers sometimes linger)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@pytest.fixture(scope="session")
def prefect_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    return dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_API_PORT=str(port),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_LOGGING_LEVEL="INFO",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        ROLLFLOW_PROJECT_DIR=str(ROOT),
    )


@pytest.fixture(scope="session")
def prefect_server(prefect_env: dict[str, str]) -> Iterator[str]:
    api = prefect_env["PREFECT_API_URL"]
    port = prefect_env["PREFECT_SERVER_API_PORT"]
    log = open(Path(prefect_env["PREFECT_HOME"]) / "server.log", "wb")
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
        env=prefect_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                with urllib.request.urlopen(api + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                text = (Path(prefect_env["PREFECT_HOME"]) / "server.log").read_text()[-3000:]
                raise RuntimeError(f"prefect server did not start:\n{text}")
            time.sleep(0.5)
        yield api
    finally:
        _stop_process(proc)


@pytest.fixture
def use_prefect_server(prefect_server: str, prefect_env: dict[str, str]) -> Iterator[str]:
    """Point this process's Prefect client at the session server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server, PREFECT_HOME: prefect_env["PREFECT_HOME"]}):
        yield prefect_server


@pytest.fixture(scope="session")
def stop_process() -> Callable[..., None]:
    """SIGTERM a process group, SIGKILL it after a grace period."""
    return _stop_process
