"""Test helper: wait until a CPU server is in the middle of a generation (for mid-generation weight updates).

What it is: ``until_generating(addr, tokens)``, polling the server's ``/get_server_info`` until its running
requests have produced at least ``tokens`` output tokens. What it is not: a readiness check (that is the
launcher's health wait).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollflow.inference.routing import control_call


def running_output_tokens(addr: str, api_key: str | None = None) -> int:
    """Output tokens the CPU server at ``addr`` has generated for its running requests so far."""
    info = control_call(addr, "/get_server_info", api_key=api_key)
    return int(info["internal_states"][0]["running_output_tokens"])


async def until_generating(
    addr: str, tokens: int, timeout_s: float = 10.0, api_key: str | None = None
) -> None:
    """Return once the server at ``addr`` has ``tokens`` output tokens in flight; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while running_output_tokens(addr, api_key) < tokens:
        assert time.monotonic() < deadline, f"{addr} did not reach {tokens} running output tokens"
        await asyncio.sleep(0.01)


async def until_vllm_streams(
    addr: str, model: str, api_key: str, timeout_s: float = 60.0, chunks: int = 1
) -> Any:
    """Return once a streamed ``/v1/completions`` on the vLLM server at ``addr`` has sent ``chunks`` token
    chunks: the engine is then decoding, and requests sent before this one are in its batch, about as far
    along. Returns the open ``httpx.AsyncClient`` of the stream; the caller closes it (``aclose``) after
    its next step, e.g. a kill."""

    body = {"model": model, "prompt": "a", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    return await _until_streams(f"http://{addr}/v1/completions", body, api_key, timeout_s, chunks)


async def _until_streams(
    url: str, body: dict[str, Any], api_key: str | None, timeout_s: float, chunks: int
) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.AsyncClient(timeout=timeout_s, headers=headers)
    response = await client.send(client.build_request("POST", url, json=body), stream=True)
    assert response.status_code == 200, await response.aread()
    lines = response.aiter_lines()
    seen = 0
    while seen < chunks:
        seen += (await asyncio.wait_for(anext(lines), timeout_s)).startswith("data: {")
    return client


async def until_sglang_streams(
    addr: str, api_key: str | None, timeout_s: float = 60.0, chunks: int = 1
) -> Any:
    """Return once a streamed ``/generate`` on the SGLang server at ``addr`` has sent ``chunks`` chunks: the
    scheduler is then decoding, and requests sent before this one are in its batch. Returns the open
    ``httpx.AsyncClient`` of the stream; the caller closes it (``aclose``) after its next step."""
    body = {
        "input_ids": [2, 7, 9], "stream": True,
        "sampling_params": {"max_new_tokens": 900, "ignore_eos": True, "temperature": 1.0},
    }  # fmt: skip
    return await _until_streams(f"http://{addr}/generate", body, api_key, timeout_s, chunks)
