"""``/generate`` with ``text``: tokenized off the event loop, and a text too long for the context refused first.

The real CPU server app (``ServerState`` + ``build_app``, the tiny model) in-process on its own event loop,
over HTTP on 127.0.0.1; its tokenizer is wrapped so the test can hold one tokenization open. While it is
held, ``/health`` and an ``input_ids`` request are answered (tokenizing on the loop used to stop the whole
server for as long as the longest text took).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web


class Gated:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.gate, self.entered = threading.Event(), threading.Event()
        self.lengths: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def encode(self, text: str, **kw: Any) -> list[int]:
        self.lengths.append(len(text))
        if "HOLD" in text:
            self.entered.set()
            assert self.gate.wait(60)
        return self._inner.encode(text, **kw)


@pytest.fixture
def served(tiny_model_dir: Path) -> Iterator[tuple[str, Gated]]:
    from infra.cpu_server.app import ServerArgs, ServerState, build_app

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[Any, web.AppRunner, int]:
        state = ServerState(ServerArgs(model_path=str(tiny_model_dir)))
        state.tokenizer = Gated(state.tokenizer)
        state.engine.start()
        runner = web.AppRunner(build_app(state))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return state, runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    state, runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(120)
    try:
        yield f"127.0.0.1:{port}", state.tokenizer
    finally:
        state.tokenizer.gate.set()
        state.engine.shutdown()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def call(addr: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{addr}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_text_being_tokenized_does_not_stop_the_server(served: tuple[str, Gated]) -> None:
    addr, tok = served
    sp = {"max_new_tokens": 3, "ignore_eos": True}
    held: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: held.update(r=call(addr, "/generate", {"text": "HOLD 1+2=", "sampling_params": sp}))
    )
    t.start()
    try:
        assert tok.entered.wait(30)
        assert call(addr, "/health", timeout=10)[0] == 200  # answered while the text is still held
        status, out = call(addr, "/generate", {"input_ids": [5, 6, 7], "sampling_params": sp}, timeout=10)
        assert status == 200 and len(out["output_ids"]) == 3
        assert "r" not in held
    finally:
        tok.gate.set()
        t.join(30)
    assert held["r"][0] == 200 and len(held["r"][1]["output_ids"]) == 3


def test_a_text_too_long_for_the_context_is_refused_before_tokenizing(served: tuple[str, Gated]) -> None:
    addr, tok = served
    status, reply = call(
        addr, "/generate", {"text": "1" * (64 * 1024 + 1), "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 400 and "65537 characters" in reply["error"]["message"], reply
    assert tok.lengths == []  # never reached the tokenizer
