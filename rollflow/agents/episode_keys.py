"""Which episode a call's api key opens: the open episodes' keys, the newest ended ones, and the refusals.

What it is: ``EndpointHTTPError`` (an HTTP refusal in OpenAI's error envelope: status, type, code, param)
with its two key refusals (``unauthorized`` 401 ``invalid_api_key``, ``episode_over`` 410
``episode_closed``), and ``EpisodeKeys``, the endpoint's key table:

    resolve(key, wanted) = the open episode of ``key``                   when it is ``wanted``'s (or no URL names one)
                         -> 401 (kind "foreign")  the key of another episode than the URL names, open or ended
                         -> 410 (kind "closed")   the key of an episode that has ended (one of the newest
                                                  ``max_closed`` ended keys; older ones are unknown)
                         -> 401 (kind "unknown")  no key, or a key nobody was given

What it is not: the HTTP server, the counting or the refusal log (``rollflow.agents.endpoint`` counts each
kind), or the episode itself (``EpisodeHandle``).
"""

from __future__ import annotations

import collections
from typing import Generic, Literal, Protocol, TypeVar

RefusalKind = Literal["foreign", "closed", "unknown"]


class EndpointHTTPError(Exception):
    """A refused call: ``status`` and OpenAI's ``type`` / ``code`` / ``param``; ``kind`` names a key refusal."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str,
        code: str | None = None,
        param: str | None = None,
        kind: RefusalKind | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.type_, self.code, self.param, self.kind = status, type_, code, param, kind


def unauthorized(message: str, kind: RefusalKind = "unknown") -> EndpointHTTPError:
    return EndpointHTTPError(401, message, type_="authentication_error", code="invalid_api_key", kind=kind)


def episode_over(message: str = "this episode is over") -> EndpointHTTPError:
    return EndpointHTTPError(
        410, message, type_="invalid_request_error", code="episode_closed", kind="closed"
    )


class KeyedEpisode(Protocol):
    episode_id: str
    api_key: str


H = TypeVar("H", bound=KeyedEpisode)


class EpisodeKeys(Generic[H]):
    """The open episodes by key (``open``) and the newest ``max_closed`` ended keys (module docstring)."""

    def __init__(self, max_closed: int = 65536) -> None:
        self.open: dict[str, H] = {}
        self._closed: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._max_closed = max_closed

    def add(self, handle: H) -> None:
        self.open[handle.api_key] = handle

    def close(self, handle: H, reason: str) -> None:
        """The episode's key stops working: its calls get 410 (401 on another episode's URL)."""
        self.open.pop(handle.api_key, None)
        self._closed[handle.api_key] = (handle.episode_id, reason)
        while len(self._closed) > self._max_closed:
            self._closed.popitem(last=False)

    def resolve(self, key: str, wanted: str | None) -> H:
        """The open episode of ``key`` for a call on ``wanted``'s URL (None: ``/v1``, found by key alone).

        Raises:
            EndpointHTTPError: 401 or 410, with ``kind`` (module docstring).
        """
        handle = self.open.get(key) if key else None
        owner = handle.episode_id if handle is not None else self._closed.get(key, (None, ""))[0]
        if owner is not None and wanted is not None and wanted != owner:
            raise unauthorized(
                "this api key belongs to another episode: use the api_key given with this base_url",
                kind="foreign",
            )
        if handle is not None:
            return handle
        if owner is not None:
            raise episode_over(f"this episode is over ({self._closed[key][1]}); its api key no longer works")
        what = "no api key (send Authorization: Bearer <api_key>)" if not key else "unknown api key"
        raise unauthorized(f"{what}: use the api_key rollflow gave the agent with this base_url")

    def owner(self, key: str) -> str | None:
        """The episode id a key was given to (open or among the remembered ended ones), else None."""
        handle = self.open.get(key)
        return handle.episode_id if handle is not None else self._closed.get(key, (None, ""))[0]
