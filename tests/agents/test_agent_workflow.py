"""``AgentWorkflow`` and its endpoint against a real CPU server serving a tiny tool-calling model.

Agents here are plain ``openai`` client code. Each test checks what the engine generated (a spy around
the real ``EngineClient`` keeps every request and result) against the trajectory rows the workflow built.
The shared ``tool_server`` is left serving version 0.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from rollflow.agents.chat_prompt import ChatPrompter
from rollflow.agents.endpoint import AgentEndpoint
from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.inference.client import EngineClient
from rollflow.inference.routing import control_call
from rollflow.workflows.agent import AgentWorkflow
from storage.schema import TrajectoryRow

ROOT = Path(__file__).resolve().parents[2]


class SpyClient:
    """The real client, keeping every (request, result) the engine answered."""

    def __init__(self, inner: EngineClient) -> None:
        self.inner = inner
        self.calls: list[tuple[GenerateRequest, GenerateResult]] = []

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        res = await self.inner.agenerate(request)
        self.calls.append((request, res))
        return res

    def get_version(self) -> int:
        return self.inner.get_version()

    def of(self, episode_id: str) -> list[tuple[GenerateRequest, GenerateResult]]:
        return [(q, r) for q, r in self.calls if (q.rid or "").startswith(episode_id)]


def run(server: Any, workflow: AgentWorkflow, rows: list[dict[str, Any]]) -> tuple[list[Any], SpyClient]:
    """Every row's episode group, concurrently, on one event loop; the workflow is closed after."""

    async def go() -> tuple[list[Any], SpyClient]:
        spy = SpyClient(EngineClient(server.addresses))
        try:
            groups = await asyncio.gather(*(workflow.arun_episode(spy, row) for row in rows))
            return list(groups), spy
        finally:
            await workflow.aclose()
            await spy.inner.aclose()

    return asyncio.run(go())


def episode_of(row: TrajectoryRow) -> str:
    return str(json.loads(row.extra)["agent_episode"])


def check_exact_tokens(row: TrajectoryRow, calls: list[tuple[GenerateRequest, GenerateResult]]) -> None:
    """The row is the last call's context; every call's prompt + completion sits in it unchanged, with
    loss_mask 1, its logprobs and versions exactly on the completion and nowhere else."""
    ids = list(row.input_ids)
    last_req, last_res = calls[-1]
    assert ids == last_req.input_ids + last_res.output_ids
    mask = [0] * len(ids)
    for req, res in calls:
        n, o = len(req.input_ids), len(res.output_ids)
        assert ids[: n + o] == req.input_ids + res.output_ids  # the prompt as sent extends the context
        assert row.logprobs[n : n + o] == pytest.approx(res.output_logprobs, abs=1e-6)
        assert list(row.versions[n : n + o]) == res.output_versions
        mask[n : n + o] = [1] * o
    assert list(row.loss_mask) == mask
    assert all(v == -1 for v, m in zip(row.versions, mask, strict=True) if m == 0)


# --- agents ----------------------------------------------------------------------------------------------


def add_tool(arguments: str) -> str:
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) + int(args["b"]))
    except Exception as exc:  # the tiny model may garble arguments: the tool answers, as a real one would
        return f"error: {type(exc).__name__}"


TRANSCRIPTS: dict[str, list[dict[str, Any]]] = {}


async def three_rounds(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    """Three questions in one conversation; each answered with the add tool. Reward: tool calls made."""
    tool = data["tool"]
    n_tool_calls = 0
    msgs: list[dict[str, Any]] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:

        async def ask() -> Any:
            r = await oa.chat.completions.create(
                model="policy", messages=msgs, tools=[tool], max_tokens=96, seed=data["seed"]
            )
            msgs.append(r.choices[0].message.model_dump(exclude_none=True))
            return r.choices[0].message

        for q in data["questions"]:
            msgs.append({"role": "user", "content": q})
            for _ in range(4):  # a garbled call is text: the model sees it and tries again
                m = await ask()
                if m.tool_calls:
                    break
            for call in m.tool_calls or []:
                msgs.append(
                    {"role": "tool", "tool_call_id": call.id, "content": add_tool(call.function.arguments)}
                )
                n_tool_calls += 1
            if m.tool_calls:
                await ask()  # the answer
    TRANSCRIPTS[base_url] = msgs
    return float(n_tool_calls)


def workflow(model_dir: Path, agent: Any, **kwargs: Any) -> AgentWorkflow:
    kwargs.setdefault("group_size", 1)
    return AgentWorkflow(agent, str(model_dir), {"max_new_tokens": 96, "temperature": 1.0}, **kwargs)


# --- exact tokens ----------------------------------------------------------------------------------------


def test_three_tool_calls_yield_the_engines_exact_tokens(
    tool_server: Any, tool_model_dir: Path, agent_lib: Any
) -> None:
    wf = workflow(tool_model_dir, three_rounds)
    data = {
        "prompt_id": "p0", "seed": 11, "tool": agent_lib.ADD_TOOL,
        "questions": ["What is 12+35?", "What is 40+27?", "What is 81+18?"],
    }  # fmt: skip
    (group,), spy = run(tool_server, wf, [data])
    assert group is not None and len(group.rows) == 1
    row = group.rows[0]
    assert row.reward == 3.0  # three tool calls were made and answered
    calls = spy.of(episode_of(row))
    assert len(calls) >= 6 and wf.counts.tool_calls >= 3
    info = json.loads(row.extra)
    assert info["n_segments"] == 1 and info["n_calls"] == len(calls) and info["n_tool_calls"] >= 3
    check_exact_tokens(row, calls)
    assert row.versions.count(0) == sum(row.loss_mask) and row.head_version == row.tail_version == 0

    # Decoding the ids gives the chat template's rendering of the agent's own transcript.
    prompter = ChatPrompter(wf.tokenizer)  # type: ignore[arg-type]
    transcript = TRANSCRIPTS.pop(next(u for u in TRANSCRIPTS if episode_of(row) in u))
    text = wf.tokenizer.decode(list(row.input_ids), skip_special_tokens=False)
    assert text + "\n" == prompter.render(transcript, [agent_lib.ADD_TOOL], add_generation_prompt=False)
    # Model tokens only are trained: the tool results and user turns are context.
    masked_text = wf.tokenizer.decode([t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m])
    assert "What is" not in masked_text and "<tool_call>" in masked_text

    # Teacher forcing on the assembled sequence reproduces every trained token's logprob.
    ids = list(row.input_ids)
    ref = agent_lib.teacher_forced_logprobs(tool_model_dir, ids, 1)  # ref[t - 1] is token t's
    trained = [t for t, m in enumerate(row.loss_mask) if m]
    assert max(abs(row.logprobs[t] - ref[t - 1]) for t in trained) < 1e-4
    assert min(row.logprobs[t] for t in trained) < -0.05  # the digits are uncertain: a real check


@pytest.mark.parametrize("example", ["calculator_agent", "sdk_calculator_agent"])
def test_the_example_agent_runs_unchanged(tool_server: Any, tool_model_dir: Path, example: str) -> None:
    """The plain ``openai`` agent and the Agents SDK one, imported as they are, no rollflow inside."""
    if example.startswith("sdk"):
        pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is not installed")
    path = ROOT / "examples" / "agents" / f"{example}.py"
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] in ("rollflow", "storage", "infra")]
    spec = importlib.util.spec_from_file_location(example, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wf = workflow(tool_model_dir, module.agent, group_size=4)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "q", "question": "What is 12+35?", "answer": "47"}])
    assert group is not None and len(group.rows) == 4 and wf.counts.episodes_kept == 4
    for row in group.rows:
        assert row.reward in (0.0, 1.0)
        check_exact_tokens(row, spy.of(episode_of(row)))
    assert wf.counts.calls_invalid == 0 and (wf.counts.tool_calls >= 1 or example.startswith("sdk"))


def test_rewritten_history_starts_a_new_segment(tool_server: Any, tool_model_dir: Path) -> None:
    async def rewriter(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            msgs: list[Any] = [{"role": "user", "content": "What is 12+35?"}]
            r = await oa.chat.completions.create(model="m", messages=msgs, max_tokens=40, seed=1)
            msgs += [r.choices[0].message, {"role": "user", "content": "And 1+1?"}]
            await oa.chat.completions.create(model="m", messages=msgs, max_tokens=40, seed=1)  # extends
            msgs[0] = {"role": "user", "content": "What is 13+35?"}  # the agent rewrote its history
            await oa.chat.completions.create(model="m", messages=msgs, max_tokens=40, seed=1)
        return 1.0

    wf = workflow(tool_model_dir, rewriter)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "r"}])
    assert group is not None and [json.loads(r.extra)["segment"] for r in group.rows] == [0, 1]
    assert [r.n_turns for r in group.rows] == [2, 1] and wf.counts.segments_new == 1
    calls = spy.of(episode_of(group.rows[0]))
    check_exact_tokens(group.rows[0], calls[:2])
    check_exact_tokens(group.rows[1], calls[2:])

    last = workflow(tool_model_dir, rewriter, segments="last")
    (group,), _ = run(tool_server, last, [{"prompt_id": "r"}])
    assert group is not None and len(group.rows) == 1 and json.loads(group.rows[0].extra)["segment"] == 1


def test_completion_prompts_extend_the_previous_context(tool_server: Any, tool_model_dir: Path) -> None:
    async def completer(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
            r = await oa.completions.create(model="m", prompt=prompt, max_tokens=30, seed=2, logprobs=1)
            assert (
                r.choices[0].logprobs is not None
                and len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
            )
            prompt += r.choices[0].text + "\nuser: ok"  # the previous prompt + text, then more text
            await oa.completions.create(model="m", prompt=prompt, max_tokens=10, seed=2)
        return 0.5

    wf = workflow(tool_model_dir, completer)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "c"}])
    assert group is not None and len(group.rows) == 1 and group.rows[0].n_turns == 2
    check_exact_tokens(group.rows[0], spy.of(episode_of(group.rows[0])))


def test_streaming_and_sync_agents_get_the_same_replies(tool_server: Any, tool_model_dir: Path) -> None:
    """A synchronous agent (``openai.OpenAI``) runs on a thread; ``stream=True`` frames the same reply."""
    returned: list[list[float]] = []

    def sync_agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            msgs = [{"role": "user", "content": "What is 12+35?"}]
            whole = oa.chat.completions.create(model="m", messages=msgs, max_tokens=40, seed=5, logprobs=True)
            chunks = list(
                oa.chat.completions.create(model="m", messages=msgs, max_tokens=40, seed=5, stream=True)
            )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
        returned.append([t.logprob for t in whole.choices[0].logprobs.content])
        return 1.0

    wf = workflow(tool_model_dir, sync_agent)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "s"}])
    assert group is not None and wf.counts.episodes_kept == 1
    # Two calls with the same prompt and seed: the same tokens; the second is a new segment.
    (q1, r1), (q2, r2) = spy.of(episode_of(group.rows[0]))
    assert q1.input_ids == q2.input_ids and r1.output_ids == r2.output_ids and len(group.rows) == 2
    assert returned == [r1.output_logprobs]  # logprobs: true returns the engine's behaviour logprobs


# --- bad input: counted drops, never trained ------------------------------------------------------------


def test_an_agent_that_raises_is_dropped_and_counted(tool_server: Any, tool_model_dir: Path) -> None:
    async def buggy(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            await oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
        raise KeyError("the agent's own bug")

    wf = workflow(tool_model_dir, buggy, group_size=2)
    (group,), _ = run(tool_server, wf, [{"prompt_id": "x"}])
    assert group is None  # every episode dropped: the group is rejected
    assert wf.counts.dropped["agent_error"] == 2 and wf.counts.episodes_kept == 0
    assert wf.counts.as_metrics()["agent_dropped_agent_error"] == 2.0


def test_an_agent_that_hangs_is_dropped_at_its_timeout(tool_server: Any, tool_model_dir: Path) -> None:
    """Past ``episode_timeout_s`` the episode is dropped, its call in flight is aborted on the server,
    and a later call with its key gets 410."""
    keys: list[tuple[str, str]] = []

    async def hangs(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        keys.append((base_url, api_key))
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            while True:  # one 900-token call can finish inside 0.5 s on an idle machine: keep calling
                await oa.completions.create(
                    model="m", prompt="a", max_tokens=900, extra_body={"ignore_eos": True}
                )

    addr = tool_server.addresses[0]

    async def go() -> tuple[Any, float, int]:
        client = EngineClient(tool_server.addresses)
        wf = workflow(tool_model_dir, hangs, episode_timeout_s=0.5)
        t0 = time.monotonic()
        try:
            group = await wf.arun_episode(client, {"prompt_id": "h"})
            took = time.monotonic() - t0
            deadline = time.monotonic() + 5
            while True:  # the abort reaches the server within moments
                info = await asyncio.to_thread(control_call, addr, "/get_server_info")
                running = info["internal_states"][0]["num_running_reqs"]
                if running == 0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            base_url, key = keys[0]
            async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as oa:
                with pytest.raises(openai.APIStatusError) as gone:
                    await oa.completions.create(model="m", prompt="a", max_tokens=2)
            assert gone.value.status_code == 410
            assert wf.counts.dropped["timeout"] == 1 and wf.counts.calls_after_close >= 1
            return group, took, running
        finally:
            await wf.aclose()
            await client.aclose()

    group, took, running = asyncio.run(go())
    assert group is None and took < 3.0
    assert running == 0  # the 900-token request was aborted, not left generating


def test_a_call_past_max_turns_drops_the_episode(tool_server: Any, tool_model_dir: Path) -> None:
    seen: list[Any] = []

    async def chatty(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            for _ in range(3):
                try:
                    await oa.completions.create(model="m", prompt="ab", max_tokens=4)
                except openai.BadRequestError as exc:
                    seen.append(exc)
                    raise
        return 1.0

    wf = workflow(tool_model_dir, chatty, max_turns=2)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "t"}])
    assert group is None and wf.counts.dropped["max_turns"] == 1 and wf.counts.dropped["agent_error"] == 0
    assert len(spy.calls) == 2  # the third call never reached the engine
    assert seen[0].code == "max_turns_exceeded" and "max_turns=2" in str(seen[0])


def test_a_call_past_the_token_budget_drops_the_episode(tool_server: Any, tool_model_dir: Path) -> None:
    async def long_winded(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            r = await oa.completions.create(
                model="m", prompt="x" * 20, max_tokens=500, extra_body={"ignore_eos": True}
            )
            assert (
                r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
            )  # capped: 60 - 20
            if data["again"]:
                await oa.completions.create(model="m", prompt="y" * 5, max_tokens=5)  # a new segment: 60 + 5
        return 1.0

    wf = workflow(tool_model_dir, long_winded, max_episode_tokens=60)
    (kept, dropped), _ = run(
        tool_server, wf, [{"prompt_id": "k", "again": False}, {"prompt_id": "d", "again": True}]
    )
    assert kept is not None and len(kept.rows[0].input_ids) == 60  # never past the budget
    assert dropped is None and wf.counts.dropped["token_budget"] == 1


def test_foreign_and_unknown_keys_are_refused_and_counted(tool_server: Any, tool_model_dir: Path) -> None:
    async def go() -> None:
        client = EngineClient(tool_server.addresses)
        from rollflow.models.tokenizer import build_tokenizer

        endpoint = AgentEndpoint(build_tokenizer())
        await endpoint.astart()
        try:
            a, b = endpoint.open_episode(client), endpoint.open_episode(client)
            msgs = [{"role": "user", "content": "hi"}]
            for base_url, key, says in (
                (a.base_url, b.api_key, "belongs to another episode"),
                (a.base_url, "sk-guess", "unknown api key"),
                (endpoint.url + "/v1", "", "unknown api key"),
            ):
                async with openai.AsyncOpenAI(base_url=base_url, api_key=key or "x", max_retries=0) as oa:
                    with pytest.raises(openai.AuthenticationError) as refused:
                        await oa.chat.completions.create(model="m", messages=msgs, max_tokens=4)
                # OpenAI's envelope, as its client reads it: status 401, code invalid_api_key, a message
                assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
                assert says in refused.value.message and "api_key" in refused.value.message
                assert key not in refused.value.message or not key  # the key is never echoed back
            assert endpoint.counts.calls_refused_foreign_key == 1
            assert endpoint.counts.calls_refused_unknown_key == 2
            assert a.recorder.calls == [] and b.recorder.calls == []  # nothing recorded anywhere
            # The key alone identifies its episode on the plain /v1 routes.
            async with openai.AsyncOpenAI(
                base_url=endpoint.url + "/v1", api_key=b.api_key, max_retries=0
            ) as oa:
                await oa.chat.completions.create(model="m", messages=msgs, max_tokens=4)
                assert [m.id for m in (await oa.models.list()).data] == ["rollflow-policy"]
            assert len(b.recorder.calls) == 1 and a.recorder.calls == []
            # An ended episode's key: 410 episode_closed on its own URL and on /v1 (documented), but
            # 401 on another episode's URL (a foreign key, open or ended).
            endpoint.close_episode(a)
            for base_url, status, code in (
                (a.base_url, 410, "episode_closed"),
                (endpoint.url + "/v1", 410, "episode_closed"),
                (b.base_url, 401, "invalid_api_key"),
            ):
                async with openai.AsyncOpenAI(base_url=base_url, api_key=a.api_key, max_retries=0) as oa:
                    with pytest.raises(openai.APIStatusError) as gone:
                        await oa.chat.completions.create(model="m", messages=msgs, max_tokens=4)
                assert (gone.value.status_code, gone.value.code) == (status, code)
            assert endpoint.counts.calls_after_close == 2 and endpoint.counts.calls_refused_foreign_key == 2
            assert a.recorder.calls == [] and len(b.recorder.calls) == 1
        finally:
            await endpoint.aclose()
            await client.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("value", ["1.0", float("nan"), math.inf, 1e39, True, [1.0]])
def test_an_agent_returning_a_bad_reward_is_dropped(
    tool_server: Any, tool_model_dir: Path, value: Any
) -> None:
    async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> Any:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            await oa.completions.create(model="m", prompt="ab", max_tokens=3)
        return value

    wf = workflow(tool_model_dir, agent)
    (group,), _ = run(tool_server, wf, [{"prompt_id": "b"}])
    assert group is None and wf.counts.dropped["bad_reward"] == 1


def test_an_agent_that_never_calls_the_model_is_dropped(tool_server: Any, tool_model_dir: Path) -> None:
    async def idle(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        return 1.0

    wf = workflow(tool_model_dir, idle)
    (group,), _ = run(tool_server, wf, [{"prompt_id": "n"}])
    assert group is None and wf.counts.dropped["no_calls"] == 1


def transcript_reward(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """0.25 when it got what it should (it runs in a reward worker process: its value is all we see)."""
    transcript = data["transcript"]
    ok = (prompt, answer, data["level"]) == ("Hi there", "42", 3)
    ok = ok and [m["role"] for m in transcript] == ["user", "assistant"]
    ok = ok and completion == (transcript[-1]["content"] or "")
    return 0.25 if ok else -1.0


def test_an_agent_returning_none_is_scored_by_the_reward_fn_or_dropped(
    tool_server: Any, tool_model_dir: Path
) -> None:
    async def no_reward(base_url: str, api_key: str, data: dict[str, Any]) -> None:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            await oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hi there"}], max_tokens=8
            )

    without = workflow(tool_model_dir, no_reward)
    (group,), _ = run(tool_server, without, [{"prompt_id": "n"}])
    assert group is None and without.counts.dropped["no_reward"] == 1

    scored = workflow(tool_model_dir, no_reward, reward_fn=transcript_reward)
    (group,), _ = run(tool_server, scored, [{"prompt_id": "n", "answer": "42", "level": 3}])
    assert scored.counts.reward_errors == 0
    assert group is not None and group.rows[0].reward == 0.25 and scored.counts.reward_scored == 1


def test_requests_the_endpoint_cannot_serve_get_a_named_400(tool_server: Any, tool_model_dir: Path) -> None:
    """Refused calls are counted, not recorded, and the episode goes on (the agent may recover)."""
    errors: list[Any] = []

    async def sloppy(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            msgs = [{"role": "user", "content": "hi"}]
            for extra in ({"n": 2}, {"stop": ["\n"]}, {"tool_choice": "required"}, {"max_tokens": 0}):
                try:
                    await oa.chat.completions.create(model="m", messages=msgs, **extra)
                except openai.BadRequestError as exc:
                    errors.append(exc)
            await oa.chat.completions.create(model="m", messages=msgs, max_tokens=8)
        return 1.0

    wf = workflow(tool_model_dir, sloppy)
    (group,), spy = run(tool_server, wf, [{"prompt_id": "v"}])
    assert [e.body["param"] for e in errors] == ["n", "stop", "tool_choice", "max_tokens"]
    assert wf.counts.calls_invalid == 4 and len(spy.calls) == 1
    assert group is not None and group.rows[0].n_turns == 1


def test_the_workflow_builds_from_config_and_runs_under_the_executor(
    tool_server: Any, tool_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout.workflow: rollflow.workflows.agent:AgentWorkflow`` with the example agent by import
    string, run by the real ``WorkflowExecutor``: groups are validated, accepted and counted."""
    from rollflow.api.config import ExperimentConfig
    from rollflow.rollout.executor import WorkflowExecutor
    from rollflow.rollout.staleness import StalenessManager
    from rollflow.workflows.factory import build_workflow

    monkeypatch.syspath_prepend(str(ROOT))  # the agent's module must import in the rollout process
    cfg = ExperimentConfig()
    cfg.model.path = str(tool_model_dir)
    cfg.rollout.group_size = 2
    cfg.rollout.workflow = "rollflow.workflows.agent:AgentWorkflow"
    cfg.rollout.workflow_kwargs = {"agent": "examples.agents.calculator_agent:agent", "max_turns": 8}
    wf = build_workflow(cfg)
    assert isinstance(wf, AgentWorkflow) and wf.group_size == 2 and wf.limits.max_turns == 8
    rows = [
        {"prompt_id": f"e{i}", "question": f"What is {10 + i}+{20 + i}?", "answer": str(30 + 2 * i)}
        for i in range(3)
    ]

    async def go() -> tuple[list[Any], Any]:
        client = EngineClient(tool_server.addresses)
        try:
            async with WorkflowExecutor(wf, client, StalenessManager(3, 1, 3)) as ex:
                return await ex.arollout_batch(rows), ex.stats
        finally:
            await wf.aclose()
            await client.aclose()

    groups, stats = asyncio.run(go())
    assert len(groups) == 3 and stats.accepted == 3 and stats.failed == 0
    assert all(len(g.rows) == 2 and g.head_version == 0 for g in groups)
    assert wf.reward_counts.as_metrics()["agent_episodes_kept"] == 6.0


def test_held_out_evaluation_runs_the_agent(
    tool_server: Any, tool_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent run is evaluated by running its agent, one greedy episode per row: accuracy is the share
    of rewards >= 1, each row says how many model turns it took, and a dropped episode scores 0."""
    from rollflow.api.config import ExperimentConfig
    from rollflow.api.inference import SamplingParams
    from rollflow.evaluation.agent import aevaluate_agent, is_agent_workflow

    monkeypatch.syspath_prepend(str(ROOT))
    cfg = ExperimentConfig()
    cfg.model.path = str(tool_model_dir)
    cfg.rollout.max_staleness = 0
    cfg.rollout.workflow = "rollflow.workflows.agent:AgentWorkflow"
    cfg.rollout.workflow_kwargs = {"agent": "examples.agents.calculator_agent:agent", "max_turns": 8}
    assert is_agent_workflow(cfg.rollout.workflow)
    assert not is_agent_workflow("rollflow.workflows.rlvr:RLVRWorkflow")
    rows = [
        {"prompt_id": f"e{i}", "question": f"What is {10 + i}+{20 + i}?", "answer": str(30 + 2 * i)}
        for i in range(3)
    ] + [{"prompt_id": "bad", "answer": "1"}]  # no question: the agent raises KeyError, dropped

    async def go() -> Any:
        client = EngineClient(tool_server.addresses)
        try:
            return await aevaluate_agent(
                cfg, client, rows, SamplingParams(max_new_tokens=48, temperature=0.0)
            )
        finally:
            await client.aclose()

    result = asyncio.run(go())
    by_id = {r["prompt_id"]: r for r in result.rows}
    assert result.n == 4 and set(by_id) == {"e0", "e1", "e2", "bad"}
    assert result.accuracy == sum(r["reward"] >= 1.0 for r in result.rows) / 4
    assert all(by_id[f"e{i}"]["turns"] >= 1 and by_id[f"e{i}"]["reward_error"] is None for i in range(3))
    assert by_id["bad"]["reward"] == 0.0 and "agent_error" in by_id["bad"]["reward_error"]
    assert result.reward_errors == 1 and set(result.versions) <= {0, -1}
