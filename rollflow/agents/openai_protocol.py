"""The OpenAI-compatible wire format of the agent endpoint: request parsing and response building.

What it is: the subset of OpenAI's ``/v1/chat/completions`` and ``/v1/completions`` that an agent
needs, checked where it enters. ``parse_chat_request`` / ``parse_completion_request`` turn a JSON body
into a typed request or raise ``AgentRequestError`` naming the field (HTTP 400 with OpenAI's error
body, ``error_body``); ``chat_response`` / ``completion_response`` (and their ``*_chunks`` for
``stream: true``) build the replies the official ``openai`` client parses.

Accepted and used: ``messages`` (text content, or a list of text parts), ``tools`` (function tools),
``tool_choice`` ``auto`` / ``none``, ``max_tokens`` / ``max_completion_tokens``, ``seed``,
``logprobs`` / ``top_logprobs: 0`` (the sampled tokens' logprobs come back), ``stream`` (the finished
reply sent as server-sent events), and vLLM's extras ``ignore_eos`` and ``stop_token_ids``.
Accepted and ignored: ``model`` (echoed), ``temperature`` / ``top_p`` (the workflow's sampling
parameters rule, because the trainer's importance weights assume them: docs/agents.md),
``parallel_tool_calls``, ``user``, ``metadata``, ``store``, ``stream_options``, ``n: 1``, unknown keys.
Refused (400, named): ``n > 1``, ``stop`` strings, penalties, ``logit_bias``, ``response_format`` other
than text, ``tool_choice`` ``required`` or a named function (nothing forces a call), non-function tools,
non-text content parts, ``echo``, ``best_of > 1``, ``suffix``, a batch of prompts.

What it is not: no HTTP (``rollflow.agents.endpoint``), no tokenization (``rollflow.agents.chat_prompt``),
no tool-call syntax (``rollflow.agents.tool_calls``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from rollflow.api.errors import AgentRequestError

Message = dict[str, Any]
ChatFinish = Literal["stop", "length", "tool_calls"]


@dataclass
class CommonParams:
    """What both routes share: the generation cap and the few sampling knobs an agent may set."""

    model: str = ""
    max_tokens: int | None = None
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class ChatRequest(CommonParams):
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] = "auto"


@dataclass
class CompletionRequest(CommonParams):
    prompt: str | list[int] = ""


def _bad(message: str, param: str | None, code: str = "invalid_request") -> AgentRequestError:
    return AgentRequestError(message, param=param, code=code)


def _int_or_none(body: dict[str, Any], key: str, *, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(f"'{key}' must be an integer >= {minimum}, got {value!r}", key)
    return value


def _common(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    n = body.get("n")
    if n not in (None, 1):
        raise _bad(f"'n' must be 1, got {n!r}: send n requests (each is recorded as its own call)", "n")
    stop = body.get("stop")
    if stop not in (None, [], ""):
        raise _bad(
            "'stop' strings are not supported: the model stops at its end-of-turn token; "
            "use 'stop_token_ids' (token ids) if you need more",
            "stop",
            "unsupported_parameter",
        )
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise _bad(
                f"'{key}' is not supported (it would change the sampled policy)", key, "unsupported_parameter"
            )
    if body.get("logit_bias"):
        raise _bad(
            "'logit_bias' is not supported (it would change the sampled policy)",
            "logit_bias",
            "unsupported_parameter",
        )
    max_tokens = _int_or_none(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _int_or_none(body, "max_tokens", minimum=1)
    seed = _int_or_none(body, "seed", minimum=0)
    if seed is not None:
        seed &= (1 << 63) - 1
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise _bad(
            "'top_logprobs' > 0 is not supported; 'logprobs: true' returns the sampled tokens' logprobs",
            "top_logprobs",
            "unsupported_parameter",
        )
    logprobs = body.get("logprobs")
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):  # /v1/completions: an int
        logprobs = logprobs > 0
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_ids
    ):
        raise _bad(f"'stop_token_ids' must be a list of token ids, got {stop_ids!r}", "stop_token_ids")
    for key in ("stream", "ignore_eos"):
        if body.get(key) not in (None, True, False):
            raise _bad(f"'{key}' must be a boolean, got {body.get(key)!r}", key)
    model = body.get("model", "")
    return {
        "model": model if isinstance(model, str) else str(model),
        "max_tokens": max_tokens,
        "seed": seed,
        "logprobs": bool(logprobs),
        "stream": bool(body.get("stream")),
        "ignore_eos": bool(body.get("ignore_eos")),
        "stop_token_ids": list(stop_ids),
    }


def text_content(content: Any, *, where: str) -> str:
    """A message's content as text: a string, None (empty) or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(
                    f"{where}.content[{i}] is a {kind!r} part; only text parts are supported",
                    where,
                    "unsupported_content",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise _bad(
        f"{where}.content must be a string or a list of text parts, got {type(content).__name__}", where
    )


def _check_messages(messages: Any) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"{where} must be an object with a 'role'", where)
        if m["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise _bad(
                f"{where}.role {m['role']!r} is not one of system, developer, user, assistant, tool", where
            )
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls must be a list", where)
        for j, call in enumerate(calls or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise _bad(
                    f"{where}.tool_calls[{j}] must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}",
                    where,
                )
        text_content(m.get("content"), where=where)
        out.append(m)
    return out


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise _bad("'tools' must be a list", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise _bad(
                f"tools[{i}] must be a function tool ({{'type': 'function', 'function': {{...}}}})",
                "tools",
                "unsupported_tool",
            )
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}].function must have a 'name'", "tools")
        params = fn.get("parameters")  # a JSON Schema object: {"type": "object", "properties": {...}}
        if params is not None and not (
            isinstance(params, dict) and isinstance(params.get("properties", {}), dict)
        ):
            what = "a JSON Schema object ({'type': 'object', 'properties': {...}})"
            raise _bad(f"tools[{i}].function.parameters must be {what}", "tools")
    return tools


def parse_chat_request(body: Any) -> ChatRequest:
    """A ``/v1/chat/completions`` body as a ``ChatRequest``.

    Raises:
        AgentRequestError: a field is malformed or asks for something the endpoint does not do.
    """
    common = _common(body)
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise _bad(
            "'response_format' other than text is not supported (no constrained decoding)",
            "response_format",
            "unsupported_parameter",
        )
    choice = body.get("tool_choice")
    if choice in (None, "auto"):
        choice = "auto"
    elif choice != "none":
        raise _bad(
            f"'tool_choice' {choice!r} is not supported: only 'auto' and 'none' (nothing forces the model to call a tool)",
            "tool_choice",
            "unsupported_parameter",
        )
    return ChatRequest(
        **common,
        messages=_check_messages(body.get("messages")),
        tools=_check_tools(body.get("tools")),
        tool_choice=choice,
    )


def parse_completion_request(body: Any) -> CompletionRequest:
    """A ``/v1/completions`` body as a ``CompletionRequest`` (one prompt: text or token ids).

    Raises:
        AgentRequestError: as ``parse_chat_request``.
    """
    common = _common(body)
    if body.get("echo"):
        raise _bad("'echo' is not supported", "echo", "unsupported_parameter")
    if body.get("best_of") not in (None, 1):
        raise _bad("'best_of' must be 1", "best_of", "unsupported_parameter")
    if body.get("suffix"):
        raise _bad("'suffix' is not supported", "suffix", "unsupported_parameter")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise _bad("'prompt' must be one string or one list of token ids (no batches)", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise _bad("'prompt' must be a non-empty string or a list of token ids", "prompt")
    return CompletionRequest(**common, prompt=prompt)


# --- replies -------------------------------------------------------------------------------------------------


def error_body(
    message: str, *, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error envelope; the ``openai`` client raises it as ``BadRequestError`` & co."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _usage(n_prompt: int, n_completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
    }


def _logprobs(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]
    }


def chat_response(
    *,
    call_id: str,
    model: str,
    message: Message,
    finish_reason: ChatFinish,
    n_prompt: int,
    n_completion: int,
    fingerprint: str,
    logprobs: tuple[list[str], list[float]] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": _logprobs(*logprobs) if logprobs is not None else None,
            }
        ],
        "usage": _usage(n_prompt, n_completion),
    }


def completion_response(
    *,
    call_id: str,
    model: str,
    text: str,
    finish_reason: Literal["stop", "length"],
    n_prompt: int,
    n_completion: int,
    fingerprint: str,
    logprobs: tuple[list[str], list[float]] | None = None,
) -> dict[str, Any]:
    """A ``text_completion`` object with one choice (logprobs in the legacy completions shape)."""
    lp = None
    if logprobs is not None:
        tokens, values = logprobs
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        lp = {"tokens": tokens, "token_logprobs": values, "top_logprobs": None, "text_offset": offsets}
    return {
        "id": call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": lp}],
        "usage": _usage(n_prompt, n_completion),
    }


def chat_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """``stream: true``: the finished ``chat.completion`` as ``chat.completion.chunk`` events.

    One chunk with the role, content and tool calls (each with its ``index``), one with the finish
    reason and usage. The reply is generated whole first; streaming only changes its framing.
    """
    choice = reply["choices"][0]
    msg = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(msg["tool_calls"])]
    head = {k: reply[k] for k in ("id", "created", "model", "system_fingerprint")}
    return [
        {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": choice["logprobs"]}],
        },
        {
            **head,
            "object": "chat.completion.chunk",
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"], "logprobs": None}
            ],
            "usage": reply["usage"],
        },
    ]


def completion_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """``stream: true`` for ``/v1/completions``: the text, then the finish reason."""
    choice = reply["choices"][0]
    head = {k: reply[k] for k in ("id", "created", "model", "system_fingerprint", "object")}
    return [
        {
            **head,
            "choices": [
                {"index": 0, "text": choice["text"], "finish_reason": None, "logprobs": choice["logprobs"]}
            ],
        },
        {
            **head,
            "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"], "logprobs": None}],
            "usage": reply["usage"],
        },
    ]


def sse(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events as the ``openai`` client reads them, closed by ``data: [DONE]``."""
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
