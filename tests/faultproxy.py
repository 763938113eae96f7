"""A fault-injecting HTTP proxy for tests: sits between the S3 client and moto's server and breaks a
seeded fraction of requests (a test helper, not a test).

Faults, drawn per request from a seeded RNG (or chosen by a `rule` for deterministic cases):

- ``503``: answer 503 SlowDown without forwarding (the store never saw the request);
- ``500-after``: forward, let the store apply it, then answer 500 InternalError (the client cannot tell
  that its write landed: a retried write then meets its own object);
- ``reset``: reset the TCP connection without forwarding;
- ``reset-after``: forward, let the store apply it, then reset the connection (a lost response);
- ``slow``: wait ``slow_s`` before forwarding (a slow reply; no timeout is hit at the default 0.2 s).

Requests are forwarded with their own Host header (moto does not check signatures, and the signature
covers Host anyway). Bodies with ``Content-Length`` or HTTP chunked framing are supported.

Usage::

    with FaultProxy(moto_endpoint, seed=0, rates={"503": 0.05, "reset-after": 0.05}) as proxy:
        storage = Storage.open(root, exp, trial, {**options, "endpoint_url": proxy.url})

What it is not: a general proxy (no TLS, no CONNECT), or a model of S3 latency.
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

FAULTS = ("503", "500-after", "reset", "reset-after", "slow")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>injected by FaultProxy'
    "</Message><RequestId>fault</RequestId></Error>"
)

# rule(method, path, headers) -> a fault name, "" for none, or None to let the random draw decide
Rule = Callable[[str, str, Mapping[str, str]], "str | None"]


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1 that injects faults; `stats` counts requests and faults."""

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        rates: Mapping[str, float] | None = None,
        slow_s: float = 0.2,
        rule: Rule | None = None,
    ) -> None:
        unknown = set(rates or {}) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {FAULTS}")
        if sum((rates or {}).values()) > 1:
            raise ValueError("fault rates must sum to at most 1")
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.rates = dict(rates or {})
        self.slow_s = slow_s
        self.rule = rule
        self.enabled = True
        self.stats: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _choose(self, method: str, path: str, headers: Mapping[str, str]) -> str:
        with self._lock:
            self.stats["requests"] += 1
            if not self.enabled:
                return ""
            fault = self.rule(method, path, headers) if self.rule is not None else None
            if fault is None:
                x, acc, fault = self._rng.random(), 0.0, ""
                for name, rate in self.rates.items():
                    acc += rate
                    if x < acc:
                        fault = name
                        break
            if fault:
                self.stats[fault] += 1
            return fault

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _reset(self) -> None:
                self.close_connection = True
                try:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.connection.close()

            def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        if k.lower() not in _HOP and k.lower() != "content-length":
                            conn.putheader(k, v)
                    if body or self.command in ("PUT", "POST"):
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body)
                    resp = conn.getresponse()
                    data = resp.read()
                    return resp.status, resp.reason, resp.getheaders(), data
                finally:
                    conn.close()

            def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status, reason)
                has_length = False
                for k, v in headers:
                    kl = k.lower()
                    if kl in _HOP or kl in ("date", "server"):
                        continue
                    if kl == "content-length":
                        has_length = True
                        if self.command != "HEAD":
                            v = str(len(data))
                    self.send_header(k, v)
                if not has_length:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD" and data:
                    self.wfile.write(data)

            def _error(self, status: int, code: str) -> None:
                data = _ERROR_XML.format(code=code).encode()
                self._reply(status, code, [("Content-Type", "application/xml")], data)

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._choose(self.command, self.path, dict(self.headers.items()))
                if fault == "503":
                    self._error(503, "SlowDown")
                    return
                if fault == "reset":
                    self._reset()
                    return
                if fault == "slow":
                    time.sleep(proxy.slow_s)
                reply = self._forward(body)
                if fault == "500-after":
                    self._error(500, "InternalError")
                elif fault == "reset-after":
                    self._reset()
                else:
                    self._reply(*reply)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle  # noqa: N815

        return Handler
