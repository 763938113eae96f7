"""Test helper: wait until a CPU server is in the middle of a generation (for mid-generation weight updates).

What it is: ``until_generating(addr, tokens)``, polling the server's ``/get_server_info`` until its running
requests have produced at least ``tokens`` output tokens. What it is not: a readiness check (that is the
launcher's health wait).
"""

from __future__ import annotations

import asyncio
import time

from rollflow.inference.routing import control_call


async def until_generating(addr: str, tokens: int, timeout_s: float = 10.0) -> None:
    """Return once the server at ``addr`` has ``tokens`` output tokens in flight; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while control_call(addr, "/get_server_info")["internal_states"][0]["running_output_tokens"] < tokens:
        assert time.monotonic() < deadline, f"{addr} did not reach {tokens} running output tokens"
        await asyncio.sleep(0.01)
