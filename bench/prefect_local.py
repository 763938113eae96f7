"""Prefect on one machine, for benches and tests: the CLI, the deployments of ``prefect.yaml``, a worker.

What it is: ``prefect_cli(env, *args)`` runs ``prefect --no-prompt ...`` from the project root and returns
its stdout (``RuntimeError`` with the output's tail when it fails); ``deploy_local(env)`` creates the
``rollflow-local`` process pool (if missing) and deploys ``prefect.yaml``; ``start_worker(env, log)``
starts a process worker on that pool in its own process group, its output in ``log``, and
``stop_worker(worker)`` stops it (SIGTERM, then SIGKILL to its group after 20 s). ``env`` points at a running server (``PREFECT_API_URL``).
``wait_http(url, proc, timeout)`` waits until a server process started here answers on ``url`` (the
test suite's servers use it too).

What it is not: a server (``tests/conftest.py``'s ``prefect_server`` and ``bench.auto_resume.main`` start
one), or the GPU deployments (``prefect-gpu.yaml``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POOL = "rollflow-local"


def prefect_cli(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    res = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"prefect {' '.join(args)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def deploy_local(env: dict[str, str]) -> None:
    """The process pool (kept if it exists) and every deployment of ``prefect.yaml``."""
    try:
        prefect_cli(env, "work-pool", "create", POOL, "--type", "process")
    except RuntimeError as e:
        if "already exists" not in str(e):
            raise
    prefect_cli(env, "deploy", "--all")


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A process worker on ``rollflow-local``, in a new session (its process group is its own)."""
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, what: str = "moto server") -> None:
    """Return once ``url`` answers (any HTTP status); ``RuntimeError`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early with code {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=0.5).read()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer on {url} within {timeout}s")
