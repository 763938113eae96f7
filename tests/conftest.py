"""Shared test fixtures: a real moto S3 server on 127.0.0.1 and a `storage` fixture that runs twice.

- `s3_server` (session): `python -m moto.server` in a subprocess on a free loopback port, started once
  for the whole session and stopped after it. Moto enforces conditional writes (If-None-Match), which
  the commit protocol relies on. Sets AWS_DEFAULT_REGION=us-east-1 and dummy credentials for the session.
- `prefect_server` (session): `prefect server start` on a free loopback port with SQLite under a temp
  PREFECT_HOME; `prefect_env` is the environment to run CLI/worker subprocesses with, and
  `use_prefect_server` points this process's Prefect client at it.
- `mlflow_server` (session): `mlflow server` on a free loopback port (SQLite + local artifacts).
- `stop_prefect_temporary_servers` (session, autouse): stops Prefect's own temporary server, if a test's
  flow run started one, before pytest closes its streams.
- `storage_spec` / `storage`: parametrized `local` | `s3` (the s3 case is marked `s3`); every test gets a
  fresh, unique trial so tests never see each other's keys.

Use from any test package:

    def test_something(storage):            # runs against a tmp dir and against moto
        storage.put_bytes("a/b", b"x")

    def test_other(storage_spec):           # to open the same trial again (another reader, a subprocess)
        again = storage_spec.open()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollflow.configuration.state_dirs import ensure_state_dirs

ensure_state_dirs()  # $PREFECT_HOME (runs/prefect from the Makefile) before any test module imports prefect

from bench.prefect_local import wait_http  # noqa: E402
from storage.fs import Storage  # noqa: E402

S3_BUCKET = "rollflow-test"


@dataclass(frozen=True)
class S3Server:
    """A running moto S3 server; `options` are Storage.open options for it."""

    endpoint_url: str
    key: str
    secret: str
    region: str
    bucket: str
    pid: int

    @property
    def options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "key": self.key,
            "secret": self.secret,
            "region": self.region,
        }


@dataclass(frozen=True)
class StorageSpec:
    """Everything needed to open a trial's Storage (also in another process)."""

    root: str
    experiment: str
    trial: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        return "s3" if self.root.startswith("s3://") else "local"

    def open(self) -> Storage:
        return Storage.open(self.root, self.experiment, self.trial, self.options)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_wait_http = wait_http  # bench.prefect_local's: the benches start servers the same way


def start_moto_server(log_path: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start `python -m moto.server` on 127.0.0.1:<free port>; returns (process, endpoint_url)."""
    last: Exception | None = None
    for _ in range(3):  # the free port can be taken between probe and bind
        port = _free_port()
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            _wait_http(endpoint + "/", proc, timeout=30)
            return proc, endpoint
        except RuntimeError as e:
            last = e
            stop_process(proc)
    raise RuntimeError(f"could not start moto server: {last}")


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0, *, group: bool = False) -> None:
    """SIGTERM, wait, then SIGKILL, by PID (or the whole process group: Prefect workers linger)."""
    if proc.poll() is not None:
        return

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=grace)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server on 127.0.0.1 for the whole session, with bucket `rollflow-test` created."""
    env = {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            mp.delenv(k, raising=False)
        log = tmp_path_factory.mktemp("moto") / "moto.log"
        proc, endpoint = start_moto_server(log)
        try:
            server = S3Server(endpoint, "testing", "testing", "us-east-1", S3_BUCKET, proc.pid)
            Storage.open(f"s3://{S3_BUCKET}", "x", "x", server.options).ensure_bucket()
            yield server
        finally:
            stop_process(proc)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StorageSpec:
    """A fresh trial on a local tmp dir or on the session's moto server."""
    trial = f"t-{uuid.uuid4().hex[:12]}"
    if request.param == "local":
        return StorageSpec(str(tmp_path / "store"), "test", trial)
    server: S3Server = request.getfixturevalue("s3_server")
    return StorageSpec(f"s3://{server.bucket}/runs", "test", trial, server.options)


@pytest.fixture
def storage(storage_spec: StorageSpec) -> Storage:
    """`Storage` of a fresh trial, local or S3 (see `storage_spec`)."""
    return storage_spec.open()


# --- Prefect and MLflow servers ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _start_logged(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # noqa: SIM115
    )


@pytest.fixture(scope="session", autouse=True)
def stop_prefect_temporary_servers() -> Iterator[None]:
    """Stop Prefect's own temporary API servers (started by a flow run with no ``PREFECT_API_URL``) at
    the end of the session, while pytest's streams are open. Left to Prefect's exit hook, the server's
    "Stopping temporary server" line went to a stream pytest had closed, and every session that had
    started one ended with a ``--- Logging error ---`` traceback after its summary."""
    yield
    if "prefect.server.api.server" in sys.modules:  # only a session that started one imported it
        from prefect.server.api.server import SubprocessASGIServer

        # Prefect's events and log workers first, while their server is up: a worker left running tried
        # to reconnect to the stopped server and logged the failure to a closed stream (a Logging error)
        for worker in _prefect_background_workers():
            worker.drain_all(timeout=10.0)

        for server in list(SubprocessASGIServer._instances.values()):
            server.stop()  # then the exit hook finds nothing to stop, and says nothing


def _prefect_background_workers() -> list[Any]:
    """Prefect's queue services this session started (imported), each with ``drain_all``."""
    out: list[Any] = []
    if "prefect.events.worker" in sys.modules:
        from prefect.events.worker import EventsWorker

        out.append(EventsWorker)
    if "prefect.logging.handlers" in sys.modules:
        from prefect.logging.handlers import APILogWorker

        out.append(APILogWorker)
    return out


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
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        ROLLFLOW_PROJECT_DIR=str(ROOT),
    )


@pytest.fixture(scope="session")
def prefect_server(prefect_env: dict[str, str]) -> Iterator[str]:
    api = prefect_env["PREFECT_API_URL"]
    log = Path(prefect_env["PREFECT_HOME"]) / "server.log"
    cmd = [
        str(BIN / "prefect"),
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        prefect_env["PREFECT_SERVER_API_PORT"],
    ]
    proc = _start_logged(cmd, prefect_env, log)
    try:
        try:
            _wait_http(api + "/health", proc, timeout=120, what="prefect server")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{log.read_text()[-3000:]}") from None
        yield api
    finally:
        stop_process(proc, grace=15, group=True)


@pytest.fixture
def use_prefect_server(prefect_server: str, prefect_env: dict[str, str]) -> Iterator[str]:
    """Point this process's Prefect client at the session server, in every thread: Prefect's log and
    event workers run outside the test's context and read the environment, and finding no API URL they
    would start Prefect's own temporary server (as ``flows.local_api`` explains)."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ.update(PREFECT_API_URL=prefect_server, PREFECT_HOME=prefect_env["PREFECT_HOME"])
    refresh_global_settings_context()
    try:
        with temporary_settings(
            updates={PREFECT_API_URL: prefect_server, PREFECT_HOME: prefect_env["PREFECT_HOME"]}
        ):
            yield prefect_server
            from prefect.logging.handlers import APILogHandler

            APILogHandler().flush()  # send this test's queued run logs while the server is up
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        refresh_global_settings_context()


@pytest.fixture(scope="session")
def stop_process_group() -> Callable[[subprocess.Popen[bytes]], None]:
    """SIGTERM a process group, SIGKILL it after 15 s."""
    return lambda proc: stop_process(proc, grace=15, group=True)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    env = dict(
        os.environ,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="true",
    )
    cmd = [
        str(BIN / "mlflow"), "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    proc = _start_logged(cmd, env, root / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_http(url + "/health", proc, timeout=90, what="mlflow server")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{(root / 'server.log').read_text()[-3000:]}") from None
        yield url
    finally:
        stop_process(proc, grace=15, group=True)
