"""A test session ends with its summary: nothing Prefect started logs to a stream pytest has closed.

A flow run with no ``PREFECT_API_URL`` starts Prefect's temporary API server, which Prefect stops from
its exit hook with a log line; after pytest has closed its streams that line was a ``--- Logging
error ---`` traceback after the summary (``make test`` ended with one). A real pytest session in a
subprocess, with this suite's conftest as a plugin, runs one such flow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ONE_FLOW = """
from prefect import flow


@flow
def one() -> int:
    return 1


def test_one_flow_run() -> None:
    assert one() == 1
"""


@pytest.mark.timeout(300)
def test_a_session_that_started_a_temporary_prefect_server_ends_without_a_logging_error(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_one_flow.py").write_text(ONE_FLOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PREFECT_HOME=str(tmp_path / "home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        DO_NOT_TRACK="true",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "conftest",
        "-p",
        "no:cacheprovider",
        "test_one_flow.py",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "1 passed" in out.stdout, text[-3000:]
    assert "Logging error" not in text, text[-3000:]
