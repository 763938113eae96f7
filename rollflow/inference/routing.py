"""Which inference server a request goes to, and the blocking control calls to a server.

What it is:

- ``ServerPool``: rid affinity through a bounded LRU (one episode's turns reuse one server and its
  prefix), otherwise the server with the fewest requests in flight from this client; a server that
  failed at the connection level is marked down and only picked again after ``down_cooldown_s``, or when
  no healthy one is left. A server ``drop``ped (its supervisor gave up on it) is never picked again;
  while one is ``restarting``, a request that found no server waits for it instead of failing.
- ``control_call``: one blocking JSON call to an engine's control route (``/pause_generation``,
  ``/collective_rpc``, ...) with urllib, for code that is not on an event loop (the engines' control
  methods, which the checkpoint watcher thread and ``EngineClient.pause()`` call);
- ``health_ok``: ``GET /health`` answered 200 (no API key needed by any engine).

What it is not: no retries or resumption (``client.py``), no weight-update policy (``watcher.py``), no
engine's routes (``sglang.py``, ``vllm.py``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rollflow.api.errors import InferenceError, InvalidRequestError, ServerUnavailableError
from rollflow.inference.sglang_protocol import error_message


def base_url(address: str) -> str:
    """``host:port`` or ``http(s)://host:port`` -> ``http://host:port`` (no trailing slash)."""
    a = address.strip().rstrip("/")
    return a if a.startswith(("http://", "https://")) else f"http://{a}"


def health_ok(address: str, timeout_s: float = 2.0) -> bool:
    """GET /health answered 200 (``/health`` needs no API key in SGLang, vLLM or the CPU server)."""
    try:
        with urllib.request.urlopen(base_url(address) + "/health", timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def auth_headers(api_key: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


class ServerPool:
    """Thread-safe routing state over a fixed list of server addresses."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        affinity_lru_size: int = 4096,
        down_cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not addresses:
            raise ValueError("ServerPool needs at least one server address")
        self.addresses = list(dict.fromkeys(addresses))
        self.affinity_lru_size = affinity_lru_size
        self.down_cooldown_s = down_cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight = dict.fromkeys(self.addresses, 0)
        self._down_until = dict.fromkeys(self.addresses, 0.0)
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._dropped: dict[str, str] = {}  # address -> why it was dropped
        self._restarting: set[str] = set()  # died; its supervisor is bringing it back
        self._tiebreak = itertools.count()

    def pick(self, rid: str | None = None, exclude: Collection[str] = ()) -> str | None:
        """The server for ``rid``: its remembered server if up, else the least loaded up server.

        Falls back to down servers (their cooldown may be stale) when every up server is excluded;
        ``None`` when every server is excluded, dropped or being restarted.
        """
        with self._lock:
            now = self._clock()
            if rid is not None and rid in self._affinity:
                addr = self._affinity[rid]
                gone = addr in self._dropped or addr in self._restarting
                if addr not in exclude and not gone and self._down_until[addr] <= now:
                    self._affinity.move_to_end(rid)
                    return addr
            candidates = [
                a
                for a in self.addresses
                if a not in exclude and a not in self._dropped and a not in self._restarting
            ]
            up = [a for a in candidates if self._down_until[a] <= now]
            pool = up or candidates
            if not pool:
                return None
            least = min(self._inflight[a] for a in pool)
            ties = [a for a in pool if self._inflight[a] == least]
            return ties[next(self._tiebreak) % len(ties)]

    def remember(self, rid: str, address: str) -> None:
        """Pin ``rid`` to ``address`` (bounded LRU: the least recently used rid is forgotten first)."""
        with self._lock:
            self._affinity[rid] = address
            self._affinity.move_to_end(rid)
            while len(self._affinity) > self.affinity_lru_size:
                self._affinity.popitem(last=False)

    def affinity(self, rid: str) -> str | None:
        with self._lock:
            return self._affinity.get(rid)

    def acquire(self, address: str) -> None:
        with self._lock:
            self._inflight[address] += 1

    def release(self, address: str) -> None:
        with self._lock:
            self._inflight[address] = max(0, self._inflight[address] - 1)

    def load(self, address: str) -> int:
        with self._lock:
            return self._inflight[address]

    def mark_down(self, address: str) -> None:
        with self._lock:
            self._down_until[address] = self._clock() + self.down_cooldown_s

    def mark_up(self, address: str) -> None:
        with self._lock:
            self._down_until[address] = 0.0

    def is_down(self, address: str) -> bool:
        with self._lock:
            return address in self._dropped or self._down_until[address] > self._clock()

    def drop(self, address: str, reason: str) -> None:
        """Never route to ``address`` again (its supervisor gave up on it). Unknown addresses are ignored."""
        with self._lock:
            if address in self._inflight:
                self._dropped[address] = reason
                self._restarting.discard(address)

    def set_restarting(self, address: str, restarting: bool) -> None:
        """``address`` died and its supervisor is restarting it (True), or that is over (False)."""
        with self._lock:
            if restarting and address in self._inflight and address not in self._dropped:
                self._restarting.add(address)
            else:
                self._restarting.discard(address)

    def restarting(self) -> bool:
        """Some server is being restarted: a request that found no server may wait for it."""
        with self._lock:
            return bool(self._restarting)

    @property
    def live_addresses(self) -> list[str]:
        """The servers not dropped (down ones included: they may come back)."""
        with self._lock:
            return [a for a in self.addresses if a not in self._dropped]

    def dropped(self) -> dict[str, str]:
        """Dropped servers and why."""
        with self._lock:
            return dict(self._dropped)


def control_call(
    address: str,
    route: str,
    body: dict[str, Any] | None = None,
    *,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    method: str | None = None,
) -> Any:
    """One blocking call; returns the parsed JSON reply (``None`` for an empty body, text if not JSON).

    Raises ``ServerUnavailableError`` when the server cannot be reached or times out,
    ``InvalidRequestError`` on a 4xx (with the server's message and the reply in ``.reply``), and
    ``InferenceError`` on a 5xx.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base_url(address) + route,
        data=data,
        headers=auth_headers(api_key),
        method=method or ("GET" if data is None else "POST"),
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        reply = _decode(raw)
        err: InferenceError
        if 400 <= e.code < 500:
            err = InvalidRequestError(f"{address}{route} -> {e.code}: {error_message(reply)}")
        else:
            err = InferenceError(f"{address}{route} -> {e.code}: {error_message(reply)}")
        err.reply, err.status = reply, e.code
        raise err from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timeout
        raise ServerUnavailableError(f"{address}{route}: {e}") from None
    return _decode(raw)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace")
