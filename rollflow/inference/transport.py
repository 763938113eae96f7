"""One generate call over HTTP: the aiohttp session, the POST and what its failure means.

What it is: ``GenerateTransport.post_generate`` POSTs one engine call (``Engine.generate_call``) to one
server and returns its replies (``Engine.parse_generate``). A failure worth sending elsewhere raises
``TransientError`` (``down``: the server itself looks dead): connect timeouts, connection failures,
malformed replies and HTTP 408, 429, 5xx; a request that got no reply in time is aborted on the server
first. Any other status is the request's fault: ``InvalidRequestError`` at once. The session belongs to
the event loop that made it (a new loop gets a new one), with the client's API key and timeouts.
What it is not: routing, retries or failover (``rollflow.inference.client.EngineClient``) or an
engine's wire format (``rollflow.inference.sglang``, ``rollflow.inference.vllm``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from rollflow.api.errors import InvalidRequestError
from rollflow.inference.contract import Engine
from rollflow.inference.routing import auth_headers, base_url
from rollflow.inference.sglang_protocol import GenerateOutput, error_message

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """A failure worth retrying elsewhere; ``down`` means the server itself looks dead."""

    def __init__(self, message: str, *, down: bool) -> None:
        super().__init__(message)
        self.down = down


class GenerateTransport:
    """The HTTP side of one ``EngineClient``: a session per event loop, generate and abort calls."""

    def __init__(
        self, engine: Engine, api_key: str | None, request_timeout_s: float, connect_timeout_s: float
    ) -> None:
        self.engine = engine
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    async def post_generate(
        self, addr: str, route: str, payload: dict[str, Any], tags: list[str]
    ) -> list[GenerateOutput]:
        """POST one generate call; one reply per tag is expected (more than one: a batch)."""
        n = len(tags)
        session = self.session()
        try:
            async with session.post(base_url(addr) + route, json=payload) as resp:
                status = resp.status
                raw = await resp.read()
        except aiohttp.ConnectionTimeoutError as e:
            raise TransientError(f"connect timeout: {e}", down=True) from None
        except TimeoutError:
            for tagged in tags:
                await self.abort_quietly(addr, tagged)
            raise TransientError(f"no reply within {self.request_timeout_s}s", down=False) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise TransientError(f"connection failed: {type(e).__name__}: {e}", down=True) from None
        try:
            body: Any = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = raw.decode(errors="replace")
        if status == 200:
            try:
                return self.engine.parse_generate(body, n)
            except (InvalidRequestError, KeyError, TypeError, ValueError) as e:
                raise TransientError(f"malformed reply: {e}", down=False) from None
        if status in RETRYABLE_STATUS:
            raise TransientError(f"HTTP {status}: {error_message(body)}", down=status == 503)
        raise InvalidRequestError(f"{addr} rejected the request (HTTP {status}): {error_message(body)}")

    async def abort_quietly(self, addr: str, rid: str) -> None:
        call = self.engine.abort_call([rid])
        try:
            session = self.session()
            async with session.post(
                base_url(addr) + call.route, json=call.payload, timeout=aiohttp.ClientTimeout(total=5)
            ):
                pass
        except Exception as e:  # best effort
            logger.debug("abort of %s on %s failed: %s", rid, addr, e)

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                headers=auth_headers(self.api_key),
                timeout=aiohttp.ClientTimeout(
                    total=self.request_timeout_s, sock_connect=self.connect_timeout_s
                ),
                connector=aiohttp.TCPConnector(limit=0),
            )
            self._session_loop = loop
        return self._session

    async def aclose(self) -> None:
        """Close the HTTP session (a later call opens a new one)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
