"""``rollflow view``'s HTTP server: the viewer's pages for one trial, on 127.0.0.1 by default.

Run it::

    rollflow view TRIAL [--config C] [--port 8765] [--host 127.0.0.1] [--api-key KEY]

What it is: a stdlib ``ThreadingHTTPServer`` with four GET routes, each a page of ``pages.Pages``:
``/`` (the run at a glance; ``?all=1`` lists every version), ``/trajectories?version=&min_reward=&
max_reward=&prompt=&finish=&limit=&offset=``, ``/trajectory?id=TRAJ_ID`` and ``/prompt?id=PROMPT_ID``.
Every request reads the shards committed at that moment (``storage.query``), so the page follows a run
that is training. No route takes SQL.

Security: the bind is loopback unless told otherwise, and a non-loopback bind without an API key is
refused. With a key (``--api-key`` or ``$ROLLFLOW_VIEWER_API_KEY``) every route wants it, compared in
constant time (``secrets.compare_digest``), as ``Authorization: Bearer KEY``, or once as ``?key=KEY``,
which answers with a redirect that sets an HttpOnly, SameSite=Strict cookie (so a browser can use the
viewer). Model text is escaped (``html``), and every reply carries a Content-Security-Policy that
forbids scripts and outside loads.

What it is not: a multi-trial browser, an editor, or a SQL endpoint (use ``rollflow query``).
"""

from __future__ import annotations

import logging
import secrets
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rollflow.api.errors import ViewerInputError
from rollflow.api.net import is_loopback_host
from rollflow.viewer import html as H
from rollflow.viewer.pages import Pages
from rollflow.viewer.trajectory_filter import TrajectoryFilter
from storage.errors import QueryError

logger = logging.getLogger(__name__)

API_KEY_ENV = "ROLLFLOW_VIEWER_API_KEY"
COOKIE = "rollflow_viewer_key"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'self'"


class ViewerServer(ThreadingHTTPServer):
    """Serves ``pages`` until ``shutdown()``; ``url`` is where it listens."""

    daemon_threads = True

    def __init__(
        self, pages: Pages, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None
    ) -> None:
        if not api_key and not is_loopback_host(host):
            raise ViewerInputError(
                f"refusing to serve trajectories on {host} without an API key: anybody who reaches the port "
                f"could read every rollout. Set ${API_KEY_ENV} (or --api-key), or bind 127.0.0.1"
            )
        self.pages = pages
        self.api_key = api_key or None
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> threading.Thread:
        """Serve on a daemon thread (tests, benchmarks); ``shutdown()`` then ``server_close()`` stop it."""
        thread = threading.Thread(target=self.serve_forever, name="trajectory-viewer", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, H.page(f"{status.value} {status.phrase}", f"<p>{H.esc(message)}</p>"))

    def _authorised(self, params: dict[str, str]) -> bool | None:
        """True: go on; False: refuse; None: a redirect that sets the cookie was sent."""
        key = self.server.api_key
        if not key:
            return True
        want = key.encode()
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), want):
            return True
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and secrets.compare_digest(value.encode(), want):
                return True
        given = params.get("key")
        if given is not None and secrets.compare_digest(given.encode(), want):
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", urlsplit(self.path).path or "/")
            self.send_header("Set-Cookie", f"{COOKIE}={key}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return False

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        ok = self._authorised(params)
        if ok is None:
            return
        if not ok:
            self._error(
                HTTPStatus.UNAUTHORIZED, "an API key is needed: open the viewer's URL with ?key=KEY once"
            )
            return
        pages = self.server.pages
        try:
            if url.path == "/":
                body: str | None = pages.overview(all_versions=params.get("all") == "1")
            elif url.path == "/trajectories":
                body = pages.trajectories(TrajectoryFilter.from_params(params))
            elif url.path == "/trajectory":
                body = pages.trajectory(params.get("id", ""))
            elif url.path == "/prompt":
                body = pages.prompt(params.get("id", ""))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no page {url.path}: try / (the overview)")
                return
        except (ViewerInputError, QueryError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except Exception:
            logger.exception("viewer page %s failed", url.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "the page failed; the viewer's log says why")
            return
        if body is None:
            self._error(HTTPStatus.NOT_FOUND, f"no committed trajectory has {params.get('id', '')!r}")
            return
        self._send(HTTPStatus.OK, body)
