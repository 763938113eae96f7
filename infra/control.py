"""Blocking calls to the SGLang control routes of a set of servers (pause / continue / model info).

What it is: a tiny synchronous helper for orchestration code that is not on an event loop (trainer
hooks of the synchronous baseline, readiness checks). What it is not: the generation client
(``rollflow.rollout.client``), which is async and handles retries and resumption.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class ServerControl:
    def __init__(self, addresses: list[str], *, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.addresses = list(addresses)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout_s

    def _call(self, address: str, route: str, body: dict[str, Any] | None = None) -> Any:
        url = address if address.startswith("http") else f"http://{address}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + route, data=data, headers=self._headers, method="GET" if data is None else "POST")
        with urllib.request.urlopen(req, timeout=self._timeout) as resp:
            raw = resp.read()
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def pause(self, mode: str = "abort") -> None:
        for a in self.addresses:
            self._call(a, "/pause_generation", {"mode": mode})

    def resume(self) -> None:
        for a in self.addresses:
            self._call(a, "/continue_generation", {})

    def weight_versions(self) -> dict[str, str]:
        """Server address -> the weight_version it serves (from /get_model_info)."""
        return {a: str(self._call(a, "/get_model_info")["weight_version"]) for a in self.addresses}
