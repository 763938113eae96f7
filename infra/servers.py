"""Start and stop inference servers as child processes: N servers of any engine, or any HTTP server command.

What it is: ``ServerGroup`` (a set of child server processes with their addresses, health wait, log files
and a clean SIGTERM -> SIGKILL stop of each server's whole process group; also a context manager),
``start_servers`` (spawn commands) and ``launch_engine_servers`` (N servers of an ``Engine`` on free
loopback ports, as its ``launch`` says); ``launch_local_servers`` is that for rollflow's CPU server
(``infra.cpu_server``), ``infra.vllm_launcher`` and ``infra.sglang_launcher`` for the others.
Children get ``PR_SET_PDEATHSIG`` on Linux, so they die with the process that launched them (a cancelled
flow run leaves no orphans), and a process group of their own, so a terminal's Ctrl-C (SIGINT to the
foreground group) reaches only the parent: it stops its loops first, then them. The API key travels in
the environment, never on the command line (SGLang's launcher is the exception: it has no other way).

Nothing is left behind: each group gets a scratch directory (``rollflow-{name}-*`` in the system temp
dir) holding its logs (unless ``log_dir`` is given) and the servers' ``TMPDIR`` (vLLM writes a
``vllm_dist_*`` file there per start); ``stop()`` removes it.

``ServerGroup.supervise`` starts an ``infra.supervisor.Supervisor`` over the group: a dead server is
restarted on its address, or given up and reported after ``max_restarts``.

``ExternalServers`` stands for servers someone else runs; both are a ``ServerHandle``.

What it is not: the supervision policy (``infra.supervisor``), an engine's command line
(``rollflow.inference``) or a client.

Example::

    with launch_local_servers(InferenceConfig(n_servers=2), "runs/models/tiny") as group:
        print(group.addresses)  # ['127.0.0.1:41231', '127.0.0.1:41233']
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from infra.supervisor import Supervisor
from rollflow.api.config import INFERENCE_WEIGHTS_ROOTS_ENV as WEIGHTS_ROOTS_ENV
from rollflow.api.config import InferenceConfig
from rollflow.api.errors import ServerStartupError
from rollflow.configuration.redact import redact_args
from rollflow.inference.contract import Engine, LaunchArgs
from rollflow.inference.routing import health_ok
from rollflow.inference.sglang import LocalEngine

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]


class ServerHandle(Protocol):
    """What the flows hold of their inference servers: a ``ServerGroup`` or ``ExternalServers``."""

    @property
    def addresses(self) -> list[str]: ...

    @property
    def supervisor(self) -> Supervisor | None: ...  # restarts dead servers (a supervised ServerGroup)

    def pids(self) -> dict[str, int]: ...

    def stop(self) -> None: ...


class ExternalServers:
    """Servers this flow does not own (``inference.backend: external``): nothing to stop or meter."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        self.supervisor: Supervisor | None = None  # not ours to restart

    def stop(self) -> None:
        return None

    def pids(self) -> dict[str, int]:
        return {}  # not our processes: nothing to meter


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def redact_command(cmd: list[str]) -> list[str]:
    """The command with the values of secret flags (``--api-key X``, ``--admin-api-key=X``) masked, for logs."""
    return redact_args(cmd)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class ServerProcess:
    address: str  # host:port
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str]

    def log_tail(self, n_lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n_lines:])
        except OSError:
            return "(no log)"


class ServerGroup:
    """Child server processes; ``addresses`` is what clients and watchers are given."""

    def __init__(
        self,
        servers: list[ServerProcess],
        *,
        shutdown_timeout_s: float = 15.0,
        env: dict[str, str] | None = None,
        scratch_dir: Path | None = None,
        on_healthy: Callable[[str], None] | None = None,
    ) -> None:
        self.servers = servers
        self.shutdown_timeout_s = shutdown_timeout_s
        self._env = env  # the children's environment, for a restart (may hold the API key: never logged)
        self.scratch_dir = scratch_dir  # removed by stop()
        self.on_healthy = on_healthy  # called with each server's address once it answers /health
        self.supervisor: Supervisor | None = None  # once supervise() was called
        self.stopping = False

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def pids(self) -> dict[str, int]:
        """``{"server{j}": pid}`` of each child process (what ``rollflow.timing`` meters)."""
        return {f"server{j}": s.process.pid for j, s in enumerate(self.servers)}

    def wait_healthy(self, timeout_s: float, *, only: list[int] | None = None) -> None:
        """Block until every server (or those at ``only``) answers /health; raise ``ServerStartupError``
        (with its log) otherwise."""
        deadline = time.monotonic() + timeout_s
        pending = [self.servers[i] for i in only] if only is not None else list(self.servers)
        while pending:
            for s in list(pending):
                if s.process.poll() is not None:
                    raise ServerStartupError(
                        f"server {s.address} exited with code {s.process.returncode} during startup; "
                        f"log {s.log_path}:\n{s.log_tail()}"
                    )
                if health_ok(s.address):
                    pending.remove(s)
                    if self.on_healthy is not None:
                        self.on_healthy(s.address)
            if pending and time.monotonic() > deadline:
                s = pending[0]
                raise ServerStartupError(
                    f"server {s.address} not healthy after {timeout_s:.0f}s; log {s.log_path}:\n{s.log_tail()}"
                )
            if pending:
                time.sleep(0.2)

    def kill(self, index: int) -> None:
        """SIGKILL one server (tests: a server dying mid-request)."""
        p = self.servers[index].process
        if p.poll() is None:
            p.kill()
            p.wait(10)

    def respawn(self, index: int) -> ServerProcess:
        """Start server ``index`` again with its command, address and environment (log appended); no wait."""
        old = self.servers[index]
        if old.process.poll() is None:
            raise RuntimeError(f"server {old.address} is still running (pid {old.process.pid})")
        _kill_group(old.process.pid)  # what the dead server left (vLLM's engine core holds gigabytes)
        logger.info("restarting server %s: %s", old.address, " ".join(redact_command(old.command)))
        new = ServerProcess(
            old.address, _spawn(old.command, old.log_path, self._env), old.log_path, old.command
        )
        self.servers[index] = new
        return new

    def supervise(self, **kw: Any) -> Supervisor:
        """Start (once) and return an ``infra.supervisor.Supervisor`` over this group; ``stop()`` ends it."""
        if self.supervisor is None:
            self.supervisor = Supervisor(self, **kw)
            self.supervisor.start()
        return self.supervisor

    def stop(self, timeout_s: float | None = None) -> None:
        """A requested stop: the supervisor's listeners hear ``on_fleet_stopping`` (clients stop failing
        over), then SIGTERM every server, wait up to ``timeout_s`` (default ``shutdown_timeout_s``), SIGKILL
        what is left of each server's process group, and remove the scratch directory."""
        timeout_s = self.shutdown_timeout_s if timeout_s is None else timeout_s
        self.stopping = True
        if self.supervisor is not None:  # first, so nothing is restarted while it stops
            self.supervisor.stop()
            self.supervisor.announce_stopping()
        for s in self.servers:
            if s.process.poll() is None:
                s.process.terminate()
        deadline = time.monotonic() + timeout_s
        for s in self.servers:
            try:
                s.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("server %s ignored SIGTERM for %.0fs; killing it", s.address, timeout_s)
                s.process.kill()
                s.process.wait(10)
            _kill_group(s.process.pid)  # workers it left behind (vLLM's engine core)
        if self.scratch_dir is not None:
            shutil.rmtree(self.scratch_dir, ignore_errors=True)

    def returncodes(self) -> list[int | None]:
        return [s.process.poll() for s in self.servers]

    def __enter__(self) -> ServerGroup:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ServerGroup({self.addresses})"


def start_servers(
    commands: list[list[str]],
    addresses: list[str],
    *,
    env: dict[str, str] | None = None,
    log_dir: str | Path | None = None,
    shutdown_timeout_s: float = 15.0,
    name: str = "server",
) -> ServerGroup:
    """Spawn one process per command (stdout+stderr to ``log_dir/{name}-{i}.log``, by default in the group's
    scratch directory); does not wait."""
    scratch = Path(tempfile.mkdtemp(prefix=f"rollflow-{name}-"))
    log_root = Path(log_dir) if log_dir else scratch
    log_root.mkdir(parents=True, exist_ok=True)
    (scratch / "tmp").mkdir()
    full_env = {**os.environ, **(env or {}), "TMPDIR": str(scratch / "tmp")}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH", "")) if p)
    servers = []
    for i, (cmd, addr) in enumerate(zip(commands, addresses, strict=True)):
        log_path = log_root / f"{name}-{i}-{addr.replace(':', '_')}.log"
        logger.debug("starting %s: %s (log %s)", name, " ".join(redact_command(cmd)), log_path)
        servers.append(ServerProcess(addr, _spawn(cmd, log_path, full_env), log_path, cmd))
    return ServerGroup(servers, shutdown_timeout_s=shutdown_timeout_s, env=full_env, scratch_dir=scratch)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a server's process group (it is its own leader: ``process_group=0``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            process_group=0,  # a terminal's Ctrl-C reaches the parent only, which stops the servers in order
        )


def launch_engine_servers(
    engine: Engine,
    cfg: InferenceConfig,
    model_path: str | Path,
    *,
    weight_version: str | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, Any] | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    startup_timeout_s: float | None = None,
    on_healthy: Callable[[str], None] | None = None,
) -> ServerGroup:
    """Start ``cfg.n_servers`` servers of ``engine`` for ``model_path`` and wait until all answer /health.

    Ports: ``cfg.base_port + i``, or free ports on ``cfg.host`` when ``base_port`` is 0 (a port lost to a
    race is retried once with new ones). ``on_healthy(address)`` runs once each server answers (also after
    a supervisor's restart). Raises ``ServerStartupError`` with the failing server's log tail.
    """
    host = cfg.host
    timeout_s = cfg.startup_timeout_s if startup_timeout_s is None else startup_timeout_s
    for attempt in range(2):
        if cfg.base_port:
            ports = [cfg.base_port + i for i in range(int(cfg.n_servers))]
        else:
            ports = [free_port(host) for _ in range(int(cfg.n_servers))]
        specs = [
            engine.launch(LaunchArgs(model_path, p, cfg, i, weight_version)) for i, p in enumerate(ports)
        ]
        child_env = {**specs[0].env, **{k: str(v) for k, v in (env or {}).items()}}
        group = start_servers(
            [[*spec.command, *extra_args] for spec in specs], [f"{host}:{p}" for p in ports], env=child_env,
            log_dir=log_dir, shutdown_timeout_s=cfg.shutdown_timeout_s,
            name="cpu-server" if engine.name == "local" else f"{engine.name}-server",
        )  # fmt: skip
        group.on_healthy = on_healthy
        try:
            group.wait_healthy(timeout_s)
            return group
        except BaseException as e:
            group.stop(timeout_s=5)
            if (
                isinstance(e, ServerStartupError)
                and attempt == 0
                and not cfg.base_port
                and "cannot bind" in str(e)
            ):
                logger.warning("port taken during startup; retrying with new ports")
                continue
            raise
    raise AssertionError("unreachable")


def launch_local_servers(
    cfg: InferenceConfig,
    model_path: str | Path,
    *,
    weight_version: str | None = None,
    log_dir: str | Path | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    env: dict[str, Any] | None = None,
    weights_roots: Sequence[str | Path] = (),
) -> ServerGroup:
    """Start ``cfg.n_servers`` CPU servers for ``model_path`` and wait until all answer /health.

    ``weights_roots``: the only directories ``/update_weights_from_disk`` may load from (the checkpoint
    store's local root and the watcher's cache; passed as ``$ROLLFLOW_WEIGHTS_ROOTS``); empty = any.
    Each server uses ``cfg.server_threads`` torch threads and reports ``weight_version`` (default
    ``cfg.initial_weight_version``). Raises ``ServerStartupError``.
    """
    extra_env = {k: str(v) for k, v in (env or {}).items()}
    if weights_roots:
        extra_env[WEIGHTS_ROOTS_ENV] = os.pathsep.join(str(Path(r).resolve()) for r in weights_roots)
    return launch_engine_servers(
        LocalEngine(), cfg, model_path, weight_version=weight_version, log_dir=log_dir, env=extra_env,
        extra_args=extra_args,
    )  # fmt: skip
