"""A call's body at the agent endpoint: how large it may be, and reading it as JSON without passing that.

What it is: ``body_limit`` and ``too_large`` (413 ``request_too_large``), and ``read_json``, which reads at
most the limit and parses:

    limit = max_body_bytes_per_token * max_episode_tokens + BODY_SLACK_BYTES

(a prompt longer than that could not fit the episode's token budget anyway). A declared
``Content-Length`` past the limit is refused before a byte is read, a chunked body as soon as the bytes
read pass it; a large body is parsed off the event loop.

What it is not: the endpoint (``rollflow.agents.endpoint``) or the request's schema
(``rollflow.agents.openai_protocol``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rollflow.agents.episode_keys import EndpointHTTPError
from rollflow.api.errors import AgentRequestError

BODY_SLACK_BYTES = 64 * 1024  # room for the request's fields beyond the messages (tools, sampling, ...)
READ_CHUNK = 65536


def body_limit(max_body_bytes_per_token: int, max_episode_tokens: int) -> int:
    """The largest body (bytes) an episode's calls may send (module docstring)."""
    return max_body_bytes_per_token * max_episode_tokens + BODY_SLACK_BYTES


def too_large(limit: int, max_body_bytes_per_token: int) -> EndpointHTTPError:
    return EndpointHTTPError(
        413,
        f"the request body is larger than this episode's limit of {limit} bytes "
        f"({max_body_bytes_per_token} bytes per token of its max_episode_tokens budget): a prompt "
        "that long could not fit the budget; send shorter messages",
        type_="invalid_request_error",
        code="request_too_large",
    )


async def read_json(
    request: web.Request,
    limit: int,
    refusal: EndpointHTTPError,
    off_loop: Callable[[Callable[[bytes], Any], bytes], Awaitable[Any]],
) -> Any:
    """The body as JSON, read only up to ``limit`` bytes (``refusal``, a 413, past it, before parsing);
    bodies of ``READ_CHUNK`` bytes or more are parsed through ``off_loop``.

    Raises:
        EndpointHTTPError: the body is larger than ``limit``.
        AgentRequestError: it is not JSON.
    """
    if request.content_length is not None and request.content_length > limit:
        raise refusal
    chunks, n = [], 0
    while chunk := await request.content.read(READ_CHUNK):
        n += len(chunk)
        if n > limit:
            raise refusal
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw) if len(raw) < READ_CHUNK else await off_loop(json.loads, raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise AgentRequestError(f"the body is not JSON: {type(exc).__name__}", code="invalid_json") from None
