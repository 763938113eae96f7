"""``Supervisor``: keeps a ``ServerGroup``'s launched inference servers alive.

What it is: a daemon thread that checks every ``interval_s`` whether each child server process is
still running. A server that exited (crash, OOM kill, ``kill -9``) is logged at ERROR with its exit code
and log tail, and started again on the same address (same port, same command, same environment), at
most ``max_restarts`` times per server. Listeners hear about it:

- ``on_server_down(address, reason)``: it died (the client fails its requests over; nothing to wait for);
- ``on_server_restarted(address)``: it answers /health again, serving the initial weights (the checkpoint
  watcher loads the current version into it);
- ``on_server_lost(address, reason)``: it is given up (restarts used up, or it would not come back
  within ``startup_timeout_s``). ``reason`` is a ``ServerLostError`` message: address, exit code, log;
- ``on_fleet_stopping()``: the group is being stopped on request (``ServerGroup.stop``): servers going
  away from now on are the shutdown, not faults (a client stops failing over, a watcher stops
  reporting them unreachable).

A restarted server keeps its address, so routing, rid affinity and the watcher's ack id stay valid.

What it is not: a health prober of servers it did not launch (the watcher notices those), or a
process manager for anything but ``ServerGroup`` children.

Example::

    group = launch_local_servers(cfg, model_path)
    sup = group.supervise(max_restarts=3, startup_timeout_s=120)
    sup.add_listener(my_listener)      # any object with some of the three methods above
    ...
    group.stop()                       # stops the supervisor first, so nothing restarts during shutdown
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rollflow.api.errors import ServerLostError, ServerStartupError

logger = logging.getLogger(__name__)


class SupervisedServer(Protocol):
    """One launched server as the supervisor sees it (``infra.servers.ServerProcess``)."""

    address: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n_lines: int = 30) -> str: ...


class SupervisedGroup(Protocol):
    """What a supervisor needs of the servers it keeps alive (``infra.servers.ServerGroup``)."""

    @property
    def servers(self) -> Sequence[SupervisedServer]: ...

    def respawn(self, index: int) -> Any: ...

    def wait_healthy(self, timeout_s: float, *, only: list[int] | None = None) -> None: ...

    def kill(self, index: int) -> None: ...


class FleetListener(Protocol):
    """What a supervisor tells; every method is optional on a listener (missing ones are skipped)."""

    def on_server_down(self, address: str, reason: str) -> None: ...

    def on_server_restarted(self, address: str) -> None: ...

    def on_server_lost(self, address: str, reason: str) -> None: ...

    def on_fleet_stopping(self) -> None: ...


class Supervisor:
    """Restart-or-give-up policy over one ``SupervisedGroup`` (see the module docstring). Thread-safe."""

    def __init__(
        self,
        group: SupervisedGroup,
        *,
        max_restarts: int = 3,
        interval_s: float = 0.5,
        startup_timeout_s: float = 120.0,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.group = group
        self.max_restarts = max_restarts
        self.interval_s = interval_s
        self.startup_timeout_s = startup_timeout_s
        self.restarts: dict[str, int] = {s.address: 0 for s in group.servers}
        self.lost: dict[str, str] = {}  # address -> why it was given up
        self._listeners: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def live_addresses(self) -> list[str]:
        return [s.address for s in self.group.servers if s.address not in self.lost]

    # --- one check -------------------------------------------------------------------------------------------

    def check_once(self) -> None:
        """Look at every server once; restart (and wait for) each one that exited."""
        for i, server in enumerate(list(self.group.servers)):
            if self._stop.is_set():
                return
            if server.address in self.lost or server.process.poll() is None:
                continue
            code = server.process.returncode
            reason = f"server {server.address} exited with code {code}; log {server.log_path}:\n{server.log_tail(15)}"
            logger.error("inference %s", reason)
            self._tell("on_server_down", server.address, reason)
            self._revive(i, reason)

    def _revive(self, index: int, reason: str) -> None:
        address = self.group.servers[index].address
        while not self._stop.is_set():
            if self.restarts[address] >= self.max_restarts:
                self._give_up(address, f"{reason}\n(restarted {self.restarts[address]} time(s) already)")
                return
            self.restarts[address] += 1
            try:
                self.group.respawn(index)
                self.group.wait_healthy(self.startup_timeout_s, only=[index])
            except ServerStartupError as e:
                if self._stop.is_set():
                    return
                logger.error("restart %d of %s failed: %s", self.restarts[address], address, e)
                reason = str(e)
                self.group.kill(index)  # it may hang unhealthy: make sure it is gone before the next try
                continue
            logger.warning("inference server %s restarted (restart %d)", address, self.restarts[address])
            self._tell("on_server_restarted", address)
            return

    def _give_up(self, address: str, reason: str) -> None:
        message = str(ServerLostError(f"giving up on inference server {address}: {reason}"))
        self.lost[address] = message
        logger.error("%s", message)
        self._tell("on_server_lost", address, message)

    def announce_stopping(self) -> None:
        """Tell the listeners that the group is being stopped on request (``on_fleet_stopping``)."""
        self._tell("on_fleet_stopping")

    def _tell(self, event: str, *args: Any) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            fn = getattr(listener, event, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:
                logger.exception("fleet listener %r raised in %s", listener, event)

    # --- thread ----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception:
                logger.exception("server supervision check failed")

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="server-supervisor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
