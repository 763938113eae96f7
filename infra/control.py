"""Blocking control calls to a set of servers: pause / continue generation, served weight versions.

What it is: a tiny synchronous facade over ``rollflow.rollout.routing.control_call`` for orchestration
code that is not on an event loop (trainer hooks of the synchronous baseline, readiness checks).
What it is not: the generation client (``rollflow.rollout.client``), which retries and resumes.
"""

from __future__ import annotations

from rollflow.rollout.routing import control_call


class ServerControl:
    def __init__(self, addresses: list[str], *, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.addresses = list(addresses)
        self._api_key = api_key
        self._timeout_s = timeout_s

    def _call(self, address: str, route: str, body: dict | None = None) -> object:
        return control_call(address, route, body, api_key=self._api_key, timeout_s=self._timeout_s)

    def pause(self, mode: str = "abort") -> None:
        for a in self.addresses:
            self._call(a, "/pause_generation", {"mode": mode})

    def resume(self) -> None:
        for a in self.addresses:
            self._call(a, "/continue_generation", {})

    def weight_versions(self) -> dict[str, str]:
        """Server address -> the weight_version it serves (from /get_model_info)."""
        return {a: str(self._call(a, "/get_model_info")["weight_version"]) for a in self.addresses}  # type: ignore[index]
