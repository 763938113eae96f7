"""An inference server's busy share and batch occupancy, from the engine counters in ``/get_server_info``.

What it is: ``ServerMeter(addresses)``; each ``sample()`` reads every server's ``internal_states[0]`` and
returns, per server, over the interval since its previous reading:

    busy_frac     = d(busy_s) / d(uptime_s)                     the engine thread's share in forward passes
    avg_batch     = d(decode_seqs_total) / d(decode_steps)      sequences per decode step
    occupancy     = avg_batch / max_running_requests            how full the batch was while decoding

The CPU server (``infra/cpu_server``) reports all three counters. An engine that lacks one (SGLang and vLLM
publish other counters) simply has no such figure; a server that does not answer is skipped.
What it is not: a health check (``rollflow.inference.fleet_health``) nor a Prometheus scraper.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from rollflow.inference.routing import control_call
from rollflow.inference.sglang_protocol import ROUTE_SERVER_INFO

logger = logging.getLogger(__name__)

COUNTERS = ("busy_s", "uptime_s", "decode_seqs_total", "decode_steps")


def engine_counters(info: Any) -> dict[str, float]:
    """The counters of ``COUNTERS`` (and ``max_running_requests``) found in a ``/get_server_info`` reply."""
    if not isinstance(info, dict):
        return {}
    states = info.get("internal_states")
    inner = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    out: dict[str, float] = {}
    for key in COUNTERS:
        value = inner.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    cap = info.get("max_running_requests")
    if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0:
        out["max_running_requests"] = float(cap)
    return out


def interval_figures(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """``busy_frac``, ``avg_batch`` and ``occupancy`` between two counter readings (those computable)."""
    out: dict[str, float] = {}
    if {"busy_s", "uptime_s"} <= a.keys() & b.keys() and b["uptime_s"] > a["uptime_s"]:
        out["busy_frac"] = max(0.0, min(1.0, (b["busy_s"] - a["busy_s"]) / (b["uptime_s"] - a["uptime_s"])))
    steps = b.get("decode_steps", 0.0) - a.get("decode_steps", 0.0)
    if steps > 0 and "decode_seqs_total" in a and "decode_seqs_total" in b:
        out["avg_batch"] = (b["decode_seqs_total"] - a["decode_seqs_total"]) / steps
        if "max_running_requests" in b:
            out["occupancy"] = out["avg_batch"] / b["max_running_requests"]
    return out


class ServerMeter:
    """Per-server figures over the interval between two ``sample()`` calls (see the module docstring)."""

    def __init__(
        self, addresses: Sequence[str], *, api_key: str | None = None, timeout_s: float = 2.0
    ) -> None:
        self.addresses = list(addresses)
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._last: dict[str, dict[str, float]] = {}
        self._first: dict[str, dict[str, float]] = {}
        self.sample()

    def _read(self, address: str) -> dict[str, float] | None:
        try:
            info = control_call(address, ROUTE_SERVER_INFO, api_key=self.api_key, timeout_s=self.timeout_s)
        except Exception as e:  # noqa: BLE001 (a server down or restarting: no reading this time)
            logger.debug("server info of %s: %s", address, e)
            return None
        return engine_counters(info)

    def sample(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for address in self.addresses:
            now = self._read(address)
            if now is None:
                continue
            prev = self._last.get(address)
            if prev is not None and now.get("uptime_s", 0.0) >= prev.get("uptime_s", 0.0):
                out[address] = interval_figures(prev, now)
            else:  # first reading, or a restarted server (its counters began again)
                self._first[address] = now
            self._last[address] = now
        return out

    def since_start(self) -> dict[str, dict[str, float]]:
        """Each server's figures since its first reading (or its restart), from the last readings."""
        return {a: interval_figures(self._first[a], self._last[a]) for a in self._last if a in self._first}
