"""A private Prefect API server for one command-line run, tied to the life of this process.

What it is: ``local_prefect_api()`` — when ``PREFECT_API_URL`` is unset, start Prefect's API app
(uvicorn, 127.0.0.1, a free port, the same settings as Prefect's own temporary server) as a child
with a parent-death signal, point this process at it, and stop it on exit. Prefect's built-in
temporary server is a plain child process: after a SIGKILL of the flow process it runs on, holding
~230 MB, indefinitely. This one receives SIGTERM from the kernel when its parent dies, however it dies.
With ``PREFECT_API_URL`` set it does nothing.
What it is not: a server for the UI or for workers (use ``prefect server start`` for those).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from infra.servers import _die_with_parent, free_port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def local_prefect_api(startup_timeout_s: float = 120.0) -> Iterator[str | None]:
    """Yield the API URL in use (None when one was already configured)."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    import prefect

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    cmd = [
        sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509 (prctl only)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"the local Prefect API server exited with code {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the local Prefect API server did not answer within {startup_timeout_s}s")
            time.sleep(0.2)
        os.environ["PREFECT_API_URL"] = url
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
