"""A private Prefect API server for one command-line run, tied to the life of this process.

What it is: ``local_prefect_api()`` — when ``PREFECT_API_URL`` is unset, start Prefect's API app
(uvicorn, 127.0.0.1, a free port, the same settings as Prefect's own temporary server) as a child
with a parent-death signal, point this process at it, and stop it on exit. Prefect's built-in
temporary server is a plain child process: after a SIGKILL of the flow process it runs on, holding
~230 MB, indefinitely. This one receives SIGTERM from the kernel when its parent dies, however it dies.
With ``PREFECT_API_URL`` set it does nothing.
No link points at it: it serves no UI and dies with the process, so while it is in use ``PREFECT_UI_URL``
is empty, and Prefect's "View at ..." line and the ``prefect.flow_run_url`` lineage tag (MLflow run and
registered model, ``tasks.runtime.flow_run_lineage``) are left out; the flow run id is still recorded.
Against the user's own server (``PREFECT_API_URL`` set) both name that server's UI.
On the way out it first drains Prefect's log and event queues into the server, then stops it: a queue left
for Prefect's exit hook would retry against a stopped server for about 80 s after the run had ended
(the process lingered at 0 % CPU, then printed "Error logging to API").
What it is not: a server for the UI or for workers (use ``prefect server start`` for those).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from infra.servers import free_port, start_servers

PRIVATE_UI_ENV = "PREFECT_UI_URL"


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def healthy(url: str) -> bool:
    """Whether the server at ``url`` (a Prefect API or an MLflow server) answers ``/health`` with 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def local_prefect_api(startup_timeout_s: float = 300.0) -> Iterator[str | None]:
    """Yield the API URL in use (None when one was already configured).

    A first start on a fresh ``PREFECT_HOME`` migrates the database, which takes a while on a busy
    machine; hence the generous timeout."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    import prefect
    from prefect.context import refresh_global_settings_context

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    ui_before = os.environ.get(PRIVATE_UI_ENV)
    env = {
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    cmd = [
        sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
        "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "error", "--lifespan", "on",
    ]  # fmt: skip
    # infra's launcher gives the child a parent-death signal; its /health is under /api here
    group = start_servers([cmd], [f"127.0.0.1:{port}"], env=env, name="prefect-api", shutdown_timeout_s=10)
    (server,) = group.servers
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not healthy(url):
            if server.process.poll() is not None:
                raise RuntimeError(f"the local Prefect API server exited:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the local Prefect API server did not answer within {startup_timeout_s}s")
            time.sleep(0.2)
        # every thread must see it: Prefect's log and event workers run outside this thread's context
        # and, finding no API URL, would start Prefect's own untied temporary server
        os.environ["PREFECT_API_URL"] = url
        os.environ[PRIVATE_UI_ENV] = ""  # empty, not unset: unset, Prefect derives a UI link from the API URL
        refresh_global_settings_context()
        yield url
    finally:
        _drain_prefect_queues(timeout_s=10.0)
        os.environ.pop("PREFECT_API_URL", None)
        _restore(PRIVATE_UI_ENV, ui_before)
        refresh_global_settings_context()
        group.stop()


def _drain_prefect_queues(timeout_s: float) -> None:
    """Send what Prefect's log and event workers still hold while the API answers, and stop them.

    On a thread of its own: ``drain_all`` called where an event loop runs (a notebook kernel's main
    thread) returns a coroutine instead of waiting, and that coroutine, never awaited, only warned
    ``coroutine 'wait' was never awaited`` while nothing was flushed. A thread has no running loop, so
    there it waits, as on the command line."""
    done = threading.Thread(target=_drain_now, args=(timeout_s,), name="rollflow-prefect-drain", daemon=True)
    done.start()
    done.join(timeout_s * 2 + 5)


def _drain_now(timeout_s: float) -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        try:
            service.drain_all(timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 (best effort: a failed flush must not hide the run's outcome)
            print(f"rollflow: could not flush Prefect's {service.__name__}: {e}", file=sys.stderr)
