"""Weight updates during agent episodes: per-token versions, and the staleness bound per episode.

One server of the module, whose versions only go up as in a run: v0 (``tool_model_dir``) -> v1
(``tool_model_dir_b``) loaded between two turns of an episode -> v2 (A's weights again) between two turns
of an episode that allows no staleness -> v3 (B) in the middle of a turn. Each update is what the
checkpoint watcher does: ``/pause_generation`` (abort), ``/update_weights_from_disk``,
``/continue_generation``, then ``client.set_version``. Teacher forcing with the right model per version
checks every token's logprob.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from rollflow.inference.client import EngineClient
from rollflow.inference.routing import control_call
from rollflow.workflows.agent import AgentWorkflow
from storage.schema import TrajectoryRow


@pytest.fixture(scope="module")
def server(tool_model_dir: Path, agent_lib: Any) -> Any:
    with agent_lib.launch_cpu_servers(tool_model_dir, 1) as group:
        yield group


def update(addr: str, model_dir: Path, version: int) -> None:
    """The watcher's sequence: pause (in-flight requests return partial output), load, continue."""
    control_call(addr, "/pause_generation", {"mode": "abort"})
    control_call(
        addr, "/update_weights_from_disk", {"model_path": str(model_dir), "weight_version": str(version)}
    )
    control_call(addr, "/continue_generation", {})


def run_agent(
    server: Any, model_dir: Path, agent: Callable[..., Awaitable[Any]], **kwargs: Any
) -> tuple[Any, AgentWorkflow, list[tuple[Any, Any]]]:
    """One episode; ``agent`` gets ``data["update"](model_dir, version)`` to load weights mid-episode."""

    async def go() -> tuple[Any, AgentWorkflow, list[tuple[Any, Any]]]:
        client = EngineClient(server.addresses)
        seen: list[tuple[Any, Any]] = []
        real = client.agenerate

        async def spy(req: Any) -> Any:
            res = await real(req)
            seen.append((req, res))
            return res

        client.agenerate = spy  # type: ignore[method-assign]

        async def do_update(model: Path, version: int) -> None:
            await asyncio.to_thread(update, server.addresses[0], model, version)
            client.set_version(version)  # as the watcher's on_update does

        wf = AgentWorkflow(agent, str(model_dir), {"max_new_tokens": 64}, group_size=1, **kwargs)
        try:
            group = await wf.arun_episode(client, {"prompt_id": "v", "update": do_update})
            return group, wf, seen
        finally:
            await wf.aclose()
            await client.aclose()

    return asyncio.run(go())


def check_logprobs_by_version(row: TrajectoryRow, models: dict[int, Path], lib: Any) -> None:
    """Each trained token's logprob is its own version's teacher-forced logprob (and not the other's)."""
    ids = list(row.input_ids)
    refs = {v: lib.teacher_forced_logprobs(m, ids, 1) for v, m in models.items()}  # ref[t - 1] is token t's
    trained = [t for t, m in enumerate(row.loss_mask) if m]
    for t in trained:
        v = row.versions[t]
        assert abs(row.logprobs[t] - refs[v][t - 1]) < 1e-4, (t, v)
    other = {a: b for a, b in (tuple(models), tuple(models)[::-1])}
    others = [abs(row.logprobs[t] - refs[other[row.versions[t]]][t - 1]) for t in trained]
    assert max(others) > 1e-3  # the two models really differ on these tokens


async def two_turns(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    """A question, the tool's answer, then the next turn after a weight update."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
        msgs: list[Any] = [{"role": "user", "content": "What is 12+35?"}]
        r = await oa.chat.completions.create(model="m", messages=msgs, max_tokens=80, seed=3)
        msgs += [r.choices[0].message, {"role": "tool", "tool_call_id": "c", "content": "47"}]
        await data["update"](*data["next"])
        await oa.chat.completions.create(model="m", messages=msgs, max_tokens=80, seed=3)
    return 1.0


def test_a_weight_update_between_turns_gives_each_token_its_version(
    server: Any, tool_model_dir: Path, tool_model_dir_b: Path, agent_lib: Any
) -> None:
    async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        return await two_turns(base_url, api_key, {**data, "next": (tool_model_dir_b, 1)})

    group, wf, seen = run_agent(server, tool_model_dir, agent, max_staleness=1)
    assert group is not None and len(group.rows) == 1
    row = group.rows[0]
    (q1, r1), (q2, r2) = seen
    assert r1.output_versions == [0] * len(r1.output_ids) and r2.output_versions == [1] * len(r2.output_ids)
    n1, n2 = len(q1.input_ids), len(q2.input_ids)
    assert list(row.versions[n1 : n1 + len(r1.output_ids)]) == r1.output_versions
    assert list(row.versions[n2:]) == r2.output_versions and (row.head_version, row.tail_version) == (0, 1)
    check_logprobs_by_version(row, {0: tool_model_dir, 1: tool_model_dir_b}, agent_lib)


def test_the_staleness_bound_applies_per_episode(
    server: Any, tool_model_dir: Path, tool_model_dir_b: Path
) -> None:
    """``max_staleness=0``: after an update between turns the next call is refused (the episode is stale)
    and the episode is dropped as stale, not as an agent error; one that starts after it is kept."""
    refused: list[Any] = []

    async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        try:
            return await two_turns(base_url, api_key, {**data, "next": (tool_model_dir, 2)})
        except openai.BadRequestError as exc:
            refused.append(exc)
            raise

    group, wf, seen = run_agent(server, tool_model_dir, agent, max_staleness=0)
    assert group is None and wf.counts.dropped["stale"] == 1 and wf.counts.dropped["agent_error"] == 0
    assert len(seen) == 1 and refused[0].code == "episode_stale"  # the call after the update never ran

    async def fresh(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            await oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
        return 1.0

    async def at_v2() -> Any:
        client = EngineClient(server.addresses, initial_version=2)
        wf = AgentWorkflow(fresh, str(tool_model_dir), group_size=1, max_staleness=0)
        try:
            return await wf.arun_episode(client, {"prompt_id": "f"})
        finally:
            await wf.aclose()
            await client.aclose()

    kept = asyncio.run(at_v2())
    assert kept is not None and kept.rows[0].head_version == 2


def test_a_weight_update_inside_a_turn_splits_its_tokens_by_version(
    server: Any, tool_model_dir: Path, tool_model_dir_b: Path, agent_lib: Any
) -> None:
    """A long call (v2 weights = A's) is paused after 40 tokens, v3 (B) is loaded, and the client resumes
    it: the completion's first tokens are version 2's, the rest version 3's, each with its own logprob."""
    addr = server.addresses[0]

    async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
        async def update_when_running() -> None:
            deadline = time.monotonic() + 20
            while (await asyncio.to_thread(control_call, addr, "/get_server_info"))["internal_states"][0][
                "running_output_tokens"
            ] < 40:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            await data["update"](tool_model_dir_b, 3)

        async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
            updating = asyncio.create_task(update_when_running())
            r = await oa.completions.create(
                model="m", prompt="What is 1+2?", max_tokens=600, extra_body={"ignore_eos": True}
            )
            await updating
        assert r.usage.completion_tokens == 600 and r.system_fingerprint == "rollflow-v3"
        return 1.0

    group, wf, seen = run_agent(server, tool_model_dir, agent)
    assert group is not None
    row = group.rows[0]
    ((req, res),) = seen
    assert res.n_interruptions >= 1
    k = res.output_versions.index(3)
    assert 40 <= k < 600 and res.output_versions == [2] * k + [3] * (600 - k)
    n = len(req.input_ids)
    assert list(row.versions[n:]) == res.output_versions and (row.head_version, row.tail_version) == (2, 3)
    check_logprobs_by_version(row, {2: tool_model_dir, 3: tool_model_dir_b}, agent_lib)
    assert json.loads(row.extra)["n_calls"] == 1
