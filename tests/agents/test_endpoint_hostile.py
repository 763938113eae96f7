"""The agent endpoint under hostile calls: long messages, oversized bodies, odd tool schemas, key floods.

A real ``AgentEndpoint`` on its own event loop (a background thread, as in a rollout) and real HTTP on
127.0.0.1; the inference client is a small fake (the engine is not what is tested here). The tokenizer is
the per-character chat tokenizer, wrapped so a test can hold one tokenization open:

* while one episode's message is being tokenized, another episode's call is answered (tokenizing runs
  off the event loop; it used to block every episode of the rollout, 13 s for an 8 MiB message);
* a body larger than the episode's token budget allows gets 413 ``request_too_large`` before it is
  parsed or tokenized, and on its declared length before it is sent (``Expect: 100-continue``);
* a tool whose ``parameters`` is not a JSON Schema object gets a 400 naming ``tools`` (was a 500 with a
  traceback in the pythonic tool format);
* 20 calls with an unknown key give 20 401s and at most one log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rollflow.agents.endpoint import AgentEndpoint
from rollflow.agents.recorder import EpisodeLimits
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.models.tokenizer import build_tokenizer


class GatedTokenizer:
    """The real tokenizer; ``encode`` of a text containing ``HOLD`` waits until the test opens the gate."""

    def __init__(self) -> None:
        self._inner = build_tokenizer()
        self.gate, self.entered = threading.Event(), threading.Event()
        self.encoded_chars: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def encode(self, text: str, **kw: Any) -> list[int]:
        self.encoded_chars.append(len(text))
        if "HOLD" in text:
            self.entered.set()
            assert self.gate.wait(60)
        return self._inner.encode(text, **kw)


class FixedClient:
    """An InferenceClient that answers every call with two tokens of the prompt."""

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        out = request.input_ids[-2:]
        return GenerateResult(request.rid or "r", request.input_ids, out, [-0.5] * 2, [0] * 2, "length")

    def get_version(self) -> int:
        return 0


class Served:
    def __init__(self, endpoint: AgentEndpoint, loop: asyncio.AbstractEventLoop) -> None:
        self.endpoint, self.loop = endpoint, loop

    def episode(self, **limits: Any) -> Any:
        async def open_() -> Any:
            return self.endpoint.open_episode(FixedClient(), EpisodeLimits(**limits))

        return asyncio.run_coroutine_threadsafe(open_(), self.loop).result(10)


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    tokenizer = GatedTokenizer()
    fmt = getattr(request, "param", "hermes")
    endpoint = AgentEndpoint(tokenizer, sampling=SamplingParams(max_new_tokens=2), tool_format=fmt)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(endpoint.astart(), loop).result(30)
    try:
        yield Served(endpoint, loop)
    finally:
        tokenizer.gate.set()
        asyncio.run_coroutine_threadsafe(endpoint.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def chat(
    handle: Any, body: dict[str, Any] | bytes, *, key: str | None = None, timeout: float = 30
) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{handle.base_url}/chat/completions",
        data=data,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key or handle.api_key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _msg(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2}


def test_a_call_being_tokenized_does_not_stall_other_episodes(served: Served) -> None:
    tok = served.endpoint.tokenizer
    slow, other = served.episode(), served.episode()
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(slow=chat(slow, _msg("HOLD this one"))))
    t.start()
    try:
        assert tok.entered.wait(30)  # the first call is inside the tokenizer, and stays there
        status, reply = chat(other, _msg("hi"), timeout=10)  # answered meanwhile: the loop is free
        assert status == 200 and reply["choices"][0]["finish_reason"] == "length"
        assert "slow" not in result
    finally:
        tok.gate.set()
        t.join(30)
    assert result["slow"][0] == 200


def _raw_call(handle: Any, body: bytes, *, declared: int, send: int, expect: bool) -> bytes:
    """POST with ``Content-Length: declared`` (and ``Expect: 100-continue``), then only ``send`` bytes of
    ``body``; what the server answered before the client sent any more (the socket stays open)."""
    url = urllib.parse.urlsplit(handle.base_url)
    head = (
        f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {handle.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n" + ("Expect: 100-continue\r\n" if expect else "") + "\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + body[:send])
        answer = b""
        while b"\r\n\r\n" not in answer or (answer.startswith(b"HTTP/1.1 4") and not answer.endswith(b"}}")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_sent(served: Served) -> None:
    """413 on the declared length: with ``Expect: 100-continue`` the agent is refused instead of invited
    to upload (it used to get ``100 Continue``, then the 413 after sending all 8 MiB); without it, the 413
    comes while only 64 KiB of the 8 MiB body was sent."""
    handle = served.episode(max_episode_tokens=256)  # limit 81,920 bytes
    body = json.dumps(_msg("x" * (8 * 1024 * 1024))).encode()
    answer = _raw_call(handle, body, declared=len(body), send=0, expect=True)  # no body byte sent
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:80]
    assert b'"request_too_large"' in answer and b"100 Continue" not in answer
    answer = _raw_call(handle, body, declared=len(body), send=64 * 1024, expect=False)
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"request_too_large"' in answer, answer[:80]
    small = json.dumps(_msg("y" * 100)).encode()  # a call that fits is invited, and waits for its body
    assert (
        _raw_call(handle, small, declared=len(small), send=0, expect=True) == b"HTTP/1.1 100 Continue\r\n\r\n"
    )
    assert max(served.endpoint.tokenizer.encoded_chars, default=0) < 1000  # the 8 MiB never tokenized


def test_a_body_past_the_token_budget_is_refused_before_tokenizing(served: Served) -> None:
    handle = served.episode(max_episode_tokens=256)  # limit: 64 * 256 + 64 KiB = 81,920 bytes
    assert served.endpoint.body_limit(handle) == 64 * 256 + 64 * 1024
    tok = served.endpoint.tokenizer
    status, reply = chat(handle, _msg("x" * (8 * 1024 * 1024)))
    assert status == 413 and reply["error"]["code"] == "request_too_large", reply
    assert "81920 bytes" in reply["error"]["message"]
    assert max(tok.encoded_chars, default=0) < 1000  # the 8 MiB message never reached the tokenizer
    status, reply = chat(handle, _msg("y" * 100))  # a call that fits goes through
    assert status == 200, reply


@pytest.mark.parametrize("served", ["pythonic", "hermes"], indirect=True)
@pytest.mark.parametrize(
    "parameters",
    ["not an object", ["a", "b"], {"type": "object", "properties": [1, 2]}, {"properties": "ab"}],
)
def test_a_tool_whose_parameters_are_not_a_schema_gets_a_named_400(served: Served, parameters: Any) -> None:
    handle = served.episode()
    tool = {"type": "function", "function": {"name": "lookup", "parameters": parameters}}
    status, reply = chat(handle, {**_msg("hi"), "tools": [tool]})
    assert status == 400, reply
    assert reply["error"]["param"] == "tools" and "tools[0].function.parameters" in reply["error"]["message"]


def test_refused_keys_are_logged_at_most_once_per_client(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    handle = served.episode()
    with caplog.at_level(logging.WARNING, logger="rollflow.agents.endpoint"):
        statuses = [chat(handle, _msg("hi"), key="rf-guessed")[0] for _ in range(20)]
    assert statuses == [401] * 20
    assert served.endpoint.counts.calls_refused_unknown_key == 20
    assert len([r for r in caplog.records if r.name == "rollflow.agents.endpoint"]) <= 1
