"""`prefect deployment run --watch` against the server docs/operations.md starts shows a run's log lines.

The documented `prefect server start` line is read from the doc and run as written (its environment
assignments included: no telemetry, and the log stream that `--watch` needs); a flow run logs a progress
line and Prefect's own watcher (what `--watch` calls, prefect/cli/flow_runs_watching.py) must print it
between the state changes. With Prefect's default settings the log stream is off and `--watch` prints
events only, which is why the doc names the two settings.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _documented_server_command() -> tuple[dict[str, str], list[str]]:
    """The env assignments and the words of the `prefect server start` line in docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text()
    (line,) = [ln for ln in text.splitlines() if "prefect server start" in ln and not ln.startswith("#")]
    words = shlex.split(line.rstrip(" &"))
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))
    return env, [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the prefect server exited"
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the prefect server did not answer on {url} within {timeout_s}s")


def test_the_documented_server_streams_run_logs_to_watch(
    tmp_path: Path, stop_process_group: Callable[[subprocess.Popen[bytes]], None]
) -> None:
    env_doc, words = _documented_server_command()
    assert env_doc.get("PREFECT_SERVER_ANALYTICS_ENABLED") == "false", env_doc  # no telemetry (issue 21)
    assert words[0].endswith("prefect") and words[1:3] == ["server", "start"], words
    port = _free_port()
    words = [str(BIN / "prefect"), *words[1:]]
    words[words.index("--port") + 1] = str(port)
    env = {**os.environ, **env_doc, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen(
        words, env=env, stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_healthy(api + "/health", server)
        code = WATCHER.replace("LINE", "progress 3/30 (10%): reward 0.307")
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
            env={**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "home")},
        )  # fmt: skip
    finally:
        stop_process_group(server)
    watched = out.stdout
    assert out.returncode == 0, watched + out.stderr[-3000:]
    assert "progress 3/30 (10%): reward 0.307" in watched, watched  # the log line, as --watch prints it
    assert "prefect.flow-run.Completed" in watched, watched  # and the events around it


# A flow that logs a line once the watcher is listening, watched by Prefect's --watch code path.
WATCHER = """
import asyncio, queue, threading, time
from prefect import flow, get_run_logger
from prefect.cli.flow_runs_watching import watch_flow_run
from prefect.runtime import flow_run
from rich.console import Console

ids = queue.Queue()

@flow(name="watch-test")
def talk():
    ids.put(flow_run.id)
    time.sleep(4)  # the watcher subscribes meanwhile
    get_run_logger().info("LINE")

t = threading.Thread(target=talk)
t.start()
console = Console(record=True, width=300)
asyncio.run(watch_flow_run(ids.get(timeout=120), console, timeout=120))
t.join()
print(console.export_text())
"""
