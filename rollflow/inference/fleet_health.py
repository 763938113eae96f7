"""``FleetHealth``: which of the checkpoint watcher's inference servers are live, and what each serves.

What it is: the bookkeeping ``CheckpointWatcher`` keeps about its servers between weight loads, and
the acks that tell checkpoint GC what they hold. Per server address:

- **live**: not dropped. ``drop(address, reason)`` removes a server for good (its supervisor gave up on
  it) and retracts its ack; an unreachable server is still live, since it may come back.
- **incarnation**: one run of a server's process. ``retire(address, reason)`` (its supervisor saw the
  process die and replaces it) retracts the acks of the incarnation that died at once, so a dead
  server never holds checkpoint GC back while it restarts (it serves nothing); the next one acks
  what it is loaded with.
- **served version**: learnt from a load (``on_serving``) or asked for by ``check_if_due``: every
  ``health_interval_s`` one version query per live server (``Engine.served_version``). ``resync(address)`` (its
  supervisor restarted it) forgets what it served and makes the next check due at once.
- **unreachable** since when: it did not answer (``on_unreachable``, or a failed check). It no longer
  holds the others back (``reachable()`` leaves it out) and is asked again by later checks; one that
  answers is reachable again. ``lagging(v)``: the reachable servers known to serve another version than
  ``v``, i.e. restarted ones back on their initial weights, which the watcher then loads ``v`` into.
- **acks**: ``ack_loading`` before a load (so GC keeps the version being loaded), a serving ack from
  ``on_serving``, ``retract`` after a failed load. ``heartbeat()`` re-acks each reachable server's
  served version once its last ack is ``ack_ttl_s / 4`` old, so a live server's ack never expires and
  a dead one's does (GC goes on past it).

The fatal rule, checked after every health check and every drop, reported through ``on_fatal(message)``
once per outage (a server answering again re-arms it)::

    fatal = no live server
            or (every live server is unreachable
                and now - max(first unreachable at, over the live servers) >= dead_server_timeout_s)

Example: servers a and b, ``dead_server_timeout_s = 60``; a stops answering at t = 0, b at t = 30.
From t = 30 every live server is unreachable, but b answered until t = 30, so the first check at or
after t = 90 reports it: "no server has answered for 60 s" is then true. After ``drop(a)`` and
``drop(b)`` it is fatal at once ("every inference server was dropped (none left)").

``default_server_id(address)`` is the storage-safe id a server acks under (``host_port``).
What it is not: no weight loading (pause / update / continue is the watcher's), no polling of LATEST,
no routing of requests (``rollflow.inference.routing``), no restarts (``infra/supervisor.py``). The
watcher's thread calls it and ``drop`` / ``resync`` come from a supervisor's thread, so the bookkeeping is
under one re-entrant lock; the health check's GETs run outside it.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollflow.api.errors import InferenceError
from rollflow.api.stores import CheckpointSource
from rollflow.inference.contract import Engine

logger = logging.getLogger(__name__)


def default_server_id(address: str) -> str:
    """A storage-safe id for an ack: ``host_port``, prefixed with this hostname for loopback addresses."""
    a = re.sub(r"^https?://", "", address).rstrip("/")
    host = a.rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]"):
        a = f"{socket.gethostname()}-{a}"
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", a).lstrip(".-")[:128]


class FleetHealth:
    """Live / unreachable / dropped servers, the version each serves, and their acks in ``store``."""

    def __init__(
        self,
        store: CheckpointSource,
        servers: Sequence[str],
        server_ids: Sequence[str],
        *,
        api_key: str | None = None,
        engine: Engine | None = None,
        health_interval_s: float = 1.0,
        dead_server_timeout_s: float = 60.0,
        ack_ttl_s: float | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store  # only its ack / retract_ack are used here
        self.servers = list(servers)
        self.api_key = api_key
        if engine is None:
            from rollflow.inference.sglang import SGLangEngine

            engine = SGLangEngine()
        self.engine: Engine = engine
        self.quiet = False  # set on a requested shutdown: servers going away is expected, not an error
        self.health_interval_s = health_interval_s
        self.dead_server_timeout_s = dead_server_timeout_s
        self.ack_ttl_s = ack_ttl_s  # the store's ack TTL: acks are refreshed every ack_ttl_s / 4
        self.on_fatal = on_fatal
        self._sid = dict(zip(self.servers, server_ids, strict=True))
        self._served: dict[str, int | None] = {}  # address -> version it serves, where known
        self._unreachable: dict[str, float] = {}  # address -> monotonic time it was first unreachable
        self._dropped: dict[str, str] = {}  # address -> why (its supervisor gave up on it)
        self._acked_at: dict[str, float] = {}  # address -> monotonic time of its last serving ack
        self._acked: dict[str, int] = {}  # address -> the version of its last serving ack
        self._next_health_check = 0.0
        self._fatal_reported = False
        self._lock = threading.RLock()  # the watcher's thread and a supervisor's (drop / resync)

    # --- who is there ----------------------------------------------------------------------------------

    def live(self) -> list[str]:
        """Servers not dropped (unreachable ones included: they may come back)."""
        with self._lock:
            return [a for a in self.servers if a not in self._dropped]

    def reachable(self) -> list[str]:
        """Live servers that answered last time they were asked."""
        with self._lock:
            return [a for a in self.live() if a not in self._unreachable]

    def needing(self, v: int) -> list[str]:
        """Live servers not known to serve ``v`` with a serving ack for it: the targets of a load of ``v``."""
        with self._lock:
            return [a for a in self.live() if self._acked.get(a) != v or self._served.get(a) != v]

    def lagging(self, v: int) -> dict[str, int | None]:
        """Reachable servers known to serve another version than ``v`` (restarted ones) -> what they serve."""
        with self._lock:
            return {
                a: self._served[a] for a in self.reachable() if a in self._served and self._served[a] != v
            }

    def unreachable_summary(self) -> str:
        with self._lock:
            now = time.monotonic()
            return ", ".join(f"{a} (for {now - t:.0f}s)" for a, t in self._unreachable.items())

    # --- events ----------------------------------------------------------------------------------------

    def on_serving(self, addr: str, v: int) -> None:
        """``addr`` answered and serves ``v`` (a load went through): reachable, served and acked."""
        with self._lock:
            self._mark_reachable(addr)
            self._served[addr] = v
            self._ack(addr, v)

    def on_unreachable(self, addr: str, message: str) -> None:
        with self._lock:
            if addr not in self._unreachable:
                self._unreachable[addr] = time.monotonic()
                level = logging.DEBUG if self.quiet else logging.ERROR
                logger.log(level, "inference server %s is unreachable: %s", addr, message)
                self._served.pop(addr, None)

    def drop(self, address: str, reason: str) -> bool:
        """Stop tracking ``address`` for good and retract its ack; False if unknown or already dropped."""
        with self._lock:
            if address not in self._sid or address in self._dropped:
                return False
            self._dropped[address] = reason
            v = self._served.pop(address, None)
            self._unreachable.pop(address, None)
            if v is not None:
                self.retract(v, [address])
            logger.error("watcher: dropped %s", address)
            self._check_fatal()
            return True

    def retire(self, address: str, reason: str) -> bool:
        """``address``'s process died and is being replaced: retract the serving ack of that incarnation,
        forget what it served, and count it unreachable until it answers again (a "loading" ack of a
        load under way is retracted by the load, which fails). False if unknown or dropped."""
        with self._lock:
            if address not in self._sid or address in self._dropped:
                return False
            versions = {self._served.pop(address, None), self._acked.pop(address, None)} - {None}
            self._acked_at.pop(address, None)
            for v in sorted(versions):
                self.retract(v, [address])
            self.on_unreachable(address, reason)
            logger.warning(
                "watcher: retired the ack(s) %s of %s (its process died)", sorted(versions), address
            )
            return True

    def resync(self, address: str) -> None:
        """``address`` was restarted: forget what it served and make the next health check due at once."""
        with self._lock:
            self._served.pop(address, None)
            self._next_health_check = 0.0

    # --- health checks ---------------------------------------------------------------------------------

    def check_if_due(self) -> None:
        """Every ``health_interval_s``: ask each live server which version it serves (one GET each).

        This is how the watcher sees a server that was restarted (it serves the initial weights again)
        or that came back after being unreachable; ``lagging`` then names it.
        """
        with self._lock:
            now = time.monotonic()
            if now < self._next_health_check:
                return
            self._next_health_check = now + self.health_interval_s
            live = self.live()
        with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:  # the GETs: outside the lock
            infos = list(pool.map(self._model_info, live))
        with self._lock:
            for addr, info in zip(live, infos, strict=True):
                if addr in self._dropped:
                    continue  # dropped while it was being asked
                if isinstance(info, str):
                    self.on_unreachable(addr, info)
                    continue
                self._mark_reachable(addr)
                served = str(info.get("weight_version")) if isinstance(info, dict) else ""
                self._served[addr] = int(served) if served.isdigit() else None
            self._check_fatal()

    def _model_info(self, addr: str) -> dict[str, Any] | str:
        """``{"weight_version": v}`` as the engine reports it, or the error message when it did not answer."""
        try:
            return {"weight_version": self.engine.served_version(addr, api_key=self.api_key, timeout_s=5.0)}
        except InferenceError as e:
            return str(e)

    def _mark_reachable(self, addr: str) -> None:
        with self._lock:
            if self._unreachable.pop(addr, None) is not None:
                logger.warning("inference server %s answers again", addr)
                self._fatal_reported = False

    def _check_fatal(self) -> None:
        """No live server answered for ``dead_server_timeout_s``: tell ``on_fatal`` once (the loop stops)."""
        with self._lock:
            live = self.live()
            if self._fatal_reported or self.on_fatal is None:
                return
            if live and any(a not in self._unreachable for a in live):
                return
            # The last answer from any live server came before the newest of their losses.
            since = max((self._unreachable[a] for a in live), default=time.monotonic())
            if live and time.monotonic() - since < self.dead_server_timeout_s:
                return
            self._fatal_reported = True
            dropped = "; ".join(f"{a}: {r}" for a, r in self._dropped.items())
            if live:
                message = f"no inference server has answered for {self.dead_server_timeout_s:.0f}s: "
                message += self.unreachable_summary() + (f"; dropped: {dropped}" if dropped else "")
            else:
                message = f"every inference server was dropped (none left): {dropped}"
            logger.error("%s", message)
            try:
                self.on_fatal(message)
            except Exception:
                logger.exception("on_fatal raised")

    # --- acks ------------------------------------------------------------------------------------------

    def ack_loading(self, v: int, addrs: Sequence[str]) -> None:
        """A "loading" ack of ``v`` for each of ``addrs``, before any file is read; raises on failure."""
        for addr in addrs:
            self.store.ack(v, self._sid[addr], state="loading")

    def retract(self, v: int, addrs: Sequence[str]) -> None:
        for addr in addrs:
            sid = self._sid[addr]
            try:
                self.store.retract_ack(v, sid)
            except Exception as e:  # the ack then only keeps v from GC a little longer
                logger.warning("retracting the loading ack of v%d for %s failed: %s", v, sid, e)

    def _ack(self, addr: str, v: int) -> None:
        with self._lock:
            try:
                self.store.ack(v, self._sid[addr])
                self._acked_at[addr] = time.monotonic()
                self._acked[addr] = v
            except Exception as e:
                logger.warning("ack of v%d for %s failed: %s", v, self._sid[addr], e)

    def heartbeat(self) -> None:
        """Re-ack the served version every ``ack_ttl_s / 4``, so a live server's ack never expires (a dead
        server's does, and checkpoint GC goes on past it)."""
        with self._lock:
            if self.ack_ttl_s is None:
                return
            now = time.monotonic()
            for addr in self.live():
                v = self._served.get(addr)
                if v is None or addr in self._unreachable:
                    continue
                if now - self._acked_at.get(addr, 0.0) >= self.ack_ttl_s / 4:
                    self._ack(addr, v)
