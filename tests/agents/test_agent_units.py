"""The agent endpoint's pure parts, without a server: the tool-call convention, prompt extension,
segments and limits of the recorder (hand-worked ids), and the request checks of the OpenAI protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollflow.agents.chat_prompt import ChatPrompter
from rollflow.agents.openai_protocol import parse_chat_request, parse_completion_request
from rollflow.agents.recorder import CallRecord, EpisodeLimits, EpisodeRecorder
from rollflow.agents.tool_calls import parse_tool_calls, template_messages, tool_call_text, tools_system_text
from rollflow.api.errors import AgentRequestError, EpisodeLimitError
from rollflow.models.tokenizer import IM_END, build_tokenizer

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


# --- the tool-call convention ------------------------------------------------------------------------------


def test_tool_call_blocks_become_openai_tool_calls() -> None:
    text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_call> {"name": "mul", "arguments": "{\\"x\\": 3}"} </tool_call>'
    r = parse_tool_calls(text, turn=4)
    assert r.content == "Let me add." and r.parse_errors == 0
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r.tool_calls
    ] == [
        ("call_4_0", "add", {"a": 1, "b": 2}),
        ("call_4_1", "mul", {"x": 3}),  # arguments written as a JSON string are parsed too
    ]
    assert r.message() == {"role": "assistant", "content": "Let me add.", "tool_calls": r.tool_calls}
    only = parse_tool_calls(tool_call_text("add", {"a": 1}), turn=0)
    assert only.content is None and len(only.tool_calls) == 1  # OpenAI: content None when only calls


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>',  # JSON cut short
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["add"]</tool_call>',  # not an object
        '<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>',  # arguments string not JSON
        '<tool_call>{"name": "add", "arguments": {"a": 1}}',  # never closed
    ],
)
def test_a_malformed_tool_call_stays_text_and_is_counted(block: str) -> None:
    r = parse_tool_calls("x" + block, turn=0)
    assert r.tool_calls == [] and r.content == "x" + block
    assert r.parse_errors == (0 if block.endswith("}}") else 1)  # an unclosed block is just text


def test_tools_become_a_system_block_when_the_template_has_none() -> None:
    msgs = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "1+2?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
    ]  # fmt: skip
    out = template_messages(msgs, [TOOL], template_has_tools=False)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("<tools>\n")
    assert out[0]["content"].endswith("Be brief.") and '{"name":"add"' in out[0]["content"]
    assert out[1] == {"role": "user", "content": "1+2?"}
    assert out[2]["content"] == '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    assert out[3] == {"role": "tool", "content": "3", "tool_call_id": "c"}
    structured = template_messages(msgs, [TOOL], template_has_tools=True)
    assert structured[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}  # HF's convention


@pytest.mark.parametrize(
    ("text", "calls", "errors"),
    [
        ("[lookup(key='ab')]", [("lookup", {"key": "ab"})], 0),
        (" [add(a=1, b=-2), f()] ", [("add", {"a": 1, "b": -2}), ("f", {})], 0),
        ("[lookup(key='ab')", [], 1),  # cut short
        ("[lookup('ab')]", [], 1),  # positional: no parameter name to give it
        ("[lookup(key=open('x'))]", [], 1),  # not a literal: never evaluated
        ("[lookup(**kw)]", [], 1),
        ("47", [], 0),  # an answer, not a call
        ("[1, 2]", [], 0),  # a list, not calls
    ],
)
def test_pythonic_tool_calls(text: str, calls: list[Any], errors: int) -> None:
    r = parse_tool_calls(text, turn=2, fmt="pythonic")
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r.tool_calls]
    assert got == calls and r.parse_errors == errors
    assert r.content == (None if calls else text)
    assert all(c["id"] == f"call_2_{i}" for i, c in enumerate(r.tool_calls))
    if calls:  # rendered back as the model wrote it (one list), so a new segment reads the same
        msgs = [{"role": "user", "content": "q"}, r.message()]
        out = template_messages(msgs, [TOOL], template_has_tools=False, fmt="pythonic")
        assert parse_tool_calls(out[2]["content"], turn=2, fmt="pythonic").tool_calls == r.tool_calls
        assert out[0] == {"role": "system", "content": "tools: add()"}


def test_pythonic_tools_line_names_parameters_and_description() -> None:
    tool = {"type": "function", "function": {"name": "lookup", "description": "A key's code.",
            "parameters": {"type": "object", "properties": {"key": {}, "n": {}}}}}  # fmt: skip
    assert tools_system_text([tool, TOOL], "pythonic") == "tools: lookup(key, n) - A key's code.; add()"


def test_an_unknown_tool_format_is_refused() -> None:
    from rollflow.workflows.agent import AgentWorkflow

    with pytest.raises(ValueError, match="tool_format must be one of hermes, pythonic, got 'json'"):
        AgentWorkflow(lambda *a: 1.0, build_tokenizer(), tool_format="json")  # type: ignore[arg-type]


def test_max_staleness_comes_from_the_run_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rollout.max_staleness`` is AgentWorkflow's per-episode bound unless ``workflow_kwargs`` sets one;
    a workflow that does not name it is built as before."""
    from rollflow.api.config import ExperimentConfig
    from rollflow.workflows.agent import AgentWorkflow
    from rollflow.workflows.factory import build_workflow

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))  # examples/
    cfg = ExperimentConfig()
    cfg.rollout.max_staleness = 3
    cfg.rollout.workflow = "rollflow.workflows.agent:AgentWorkflow"
    tok = build_tokenizer()
    for extra, bound in (({}, 3), ({"max_staleness": 1}, 1), ({"max_staleness": None}, None)):
        cfg.rollout.workflow_kwargs = {"agent": "examples.agents.lookup_agent:agent", **extra}
        wf = build_workflow(cfg, tokenizer=tok)
        assert isinstance(wf, AgentWorkflow) and wf.limits.max_staleness == bound
        wf.close()
    cfg.rollout.workflow, cfg.rollout.workflow_kwargs = "rollflow.workflows.rlvr:RLVRWorkflow", {}
    assert not hasattr(build_workflow(cfg, tokenizer=tok), "limits")


# --- prompt extension ----------------------------------------------------------------------------------------


def test_a_continued_chat_extends_the_exact_previous_tokens() -> None:
    tok = build_tokenizer()
    p = ChatPrompter(tok)
    im_end = tok.convert_tokens_to_ids(IM_END)
    assert p.end_of_turn_id == im_end and not p.template_has_tools
    first = [{"role": "user", "content": "1+2?"}]
    prompt = p.full_ids(first, [TOOL])
    # The model wrote a call the template would render differently (compact JSON), then stopped on <|im_end|>.
    text = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call>'
    out = tok.encode(text, add_special_tokens=False) + [im_end]
    reply = parse_tool_calls(text, turn=0).message()  # what the endpoint returns: content None + tool_calls
    nxt = [*first, reply, {"role": "tool", "content": "3"}]
    delta = p.delta_ids(first, [TOOL], reply, nxt, [TOOL], last_token=im_end)
    assert delta is not None
    assert (
        tok.decode(delta, skip_special_tokens=False)
        == "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    )
    # Stopped by length (no <|im_end|>): the template's closing follows the model's last token.
    delta_len = p.delta_ids(first, [TOOL], reply, nxt, [TOOL], last_token=out[-2])
    assert tok.decode(delta_len, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>tool")
    # Re-rendering the transcript would drift ('{"name": "add", ...}' with spaces): the extension keeps
    # the model's own tokens.
    rerendered = p.full_ids(nxt, [TOOL])
    assert prompt + out + delta != rerendered and len(prompt + out + delta) < len(rerendered)
    # Not a continuation: edited history, a changed reply, other tools, nothing new.
    edited = [{"role": "user", "content": "1+3?"}, reply, {"role": "tool", "content": "3"}]
    assert p.delta_ids(first, [TOOL], reply, edited, [TOOL], last_token=im_end) is None
    changed = [*first, {"role": "assistant", "content": "other"}, {"role": "tool", "content": "3"}]
    assert p.delta_ids(first, [TOOL], reply, changed, [TOOL], last_token=im_end) is None
    assert p.delta_ids(first, [TOOL], reply, nxt, None, last_token=im_end) is None
    assert p.delta_ids(first, [TOOL], reply, [*first, reply], [TOOL], last_token=im_end) is None


# --- the recorder ---------------------------------------------------------------------------------------------


def call(i: int, prompt: list[int], out: list[int], version: int = 0) -> CallRecord:
    return CallRecord(
        i, "completion", prompt, out, [-0.5 - k for k in range(len(out))], [version] * len(out), "stop"
    )


def test_segments_masks_and_versions_by_hand() -> None:
    rec = EpisodeRecorder("e")
    rec.record(call(0, [1, 2], [3, 4]))  # a b -> c d
    rec.record(call(1, [1, 2, 3, 4, 5], [6], version=1))  # + e (tool text) -> f, by version 1
    rec.record(call(2, [1, 9], [7, 8], version=1))  # rewritten history: segment 2
    assert [c.segment for c in rec.calls] == [0, 0, 1]
    rows = rec.build_rows(prompt_id="p", reward=0.5)
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4, 5, 6], [1, 9, 7, 8]]
    assert rows[0].loss_mask == [0, 0, 1, 1, 0, 1]  # e is context
    assert rows[0].logprobs == [0.0, 0.0, -0.5, -1.5, 0.0, -0.5]
    assert rows[0].versions == [-1, -1, 0, 0, -1, 1]
    assert (rows[0].head_version, rows[0].tail_version, rows[0].n_turns) == (0, 1, 2)
    assert rows[1].loss_mask == [0, 0, 1, 1] and rows[1].versions == [-1, -1, 1, 1]
    assert all(r.reward == 0.5 for r in rows)
    assert json.loads(rows[1].extra)["n_segments"] == 2
    last = rec.build_rows(prompt_id="p", reward=0.5, policy="last")
    assert [r.input_ids for r in last] == [[1, 9, 7, 8]]
    assert rec.n_tokens() == 10 and rec.head_version() == 0


def test_limits_refuse_the_call_and_drop_the_episode() -> None:
    rec = EpisodeRecorder("e", EpisodeLimits(max_turns=2, max_episode_tokens=10))
    assert rec.admit([1, 2], 100, version=0) == 8  # capped to the budget: 10 - 2
    rec.record(call(0, [1, 2], [3, 4]))
    # Extending: the current segment is not counted twice; 10 - 5 = 5 tokens left.
    assert rec.admit([1, 2, 3, 4, 5], 100, version=0) == 5
    rec.record(call(1, [1, 2, 3, 4, 5], [6]))
    with pytest.raises(EpisodeLimitError) as turns:
        rec.admit([1, 2, 3, 4, 5, 6, 7], 1, version=0)
    assert turns.value.reason == "max_turns" and rec.drop_reason == "max_turns"

    budget = EpisodeRecorder("b", EpisodeLimits(max_episode_tokens=6))
    budget.admit([1, 2], 4, version=0)
    budget.record(call(0, [1, 2], [3, 4, 5, 6]))
    with pytest.raises(EpisodeLimitError) as over:  # a new segment: 6 closed tokens + 1 >= 6
        budget.admit([9], 1, version=0)
    assert over.value.reason == "token_budget" and budget.drop_reason == "token_budget"

    stale = EpisodeRecorder("s", EpisodeLimits(max_staleness=1))
    stale.admit([1], 1, version=3)
    stale.record(call(0, [1], [2], version=3))
    assert stale.admit([1, 2, 3], 1, version=4) == 1  # 3 >= 4 - 1
    with pytest.raises(EpisodeLimitError) as old:
        stale.admit([1, 2, 3], 1, version=5)  # 3 < 5 - 1
    assert old.value.reason == "stale" and stale.drop_reason == "stale"


# --- request checks -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["\n"]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1}, "presence_penalty"),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ("not an object", None),
    ],
)
def test_requests_the_endpoint_cannot_serve_are_named(body: Any, param: str | None) -> None:
    with pytest.raises(AgentRequestError) as exc:
        parse_chat_request(body)
    assert exc.value.param == param


def test_completion_prompts_one_text_or_ids() -> None:
    assert parse_completion_request({"prompt": "ab"}).prompt == "ab"
    assert parse_completion_request({"prompt": [[1, 2]]}).prompt == [1, 2]
    r = parse_completion_request(
        {"prompt": "x", "max_tokens": 3, "seed": 7, "logprobs": 1, "ignore_eos": True}
    )
    assert (r.max_tokens, r.seed, r.logprobs, r.ignore_eos) == (3, 7, True, True)
    for bad in ({"prompt": ["a", "b"]}, {"prompt": ""}, {"prompt": [1, -2]}, {"prompt": "x", "echo": True}):
        with pytest.raises(AgentRequestError):
            parse_completion_request(bad)


def test_a_client_that_leaves_mid_request_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """At the end of a run the agents still calling are cancelled and their connections close before the
    endpoint read their body: nobody is there to answer, and the log gets no traceback."""
    import asyncio
    import logging

    from rollflow.agents.endpoint import AgentEndpoint
    from rollflow.models.tokenizer import build_tokenizer

    async def go() -> None:
        endpoint = AgentEndpoint(build_tokenizer())
        await endpoint.astart()
        try:
            port = int(endpoint.url.rsplit(":", 1)[1])
            handle = endpoint.open_episode(client=None)  # type: ignore[arg-type]  # never reached
            path = handle.base_url.removeprefix(endpoint.url) + "/chat/completions"
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Authorization: Bearer {handle.api_key}\r\nContent-Length: 1000\r\n\r\n".encode()
                    + b'{"model": '
                )  # 10 of the 1000 bytes promised, then gone
                await writer.drain()
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.3)  # the server notices the lost connections
        finally:
            await endpoint.aclose()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
