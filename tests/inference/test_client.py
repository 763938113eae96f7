"""``EngineClient`` against real CPU servers on 127.0.0.1: resumption, routing, retries and failover.

The weight update in the middle of a generation (tokens from two versions) is in test_watcher.py, where
the real watcher drives it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.servers import free_port
from rollflow.api.errors import InvalidRequestError, ServerUnavailableError
from rollflow.api.inference import GenerateRequest, GenerateResult, InferenceClient, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.inference.routing import ServerPool, control_call

PROMPT = [5, 6, 7, 8]


def running_tokens(addr: str) -> int:
    st = control_call(addr, "/get_server_info")["internal_states"][0]
    return int(st["running_output_tokens"])


async def wait_tokens(addr: str, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(running_tokens, addr) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no request reached {n} tokens on {addr}")


def greedy(n: int, rid: str | None = None) -> GenerateRequest:
    return GenerateRequest(
        PROMPT, SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True), rid=rid
    )


def check_logprobs(r: GenerateResult, model_dir: Path, lib: Any) -> None:
    ref = lib.teacher_forced_logprobs(model_dir, r.input_ids + r.output_ids, len(r.input_ids))
    assert max(abs(a - b) for a, b in zip(r.output_logprobs, ref, strict=True)) < 1e-4


def test_agenerate_returns_tokens_logprobs_and_versions(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    async def go() -> GenerateResult:
        client = EngineClient(cpu_server.addresses)
        assert isinstance(client, InferenceClient)
        try:
            return await client.agenerate(
                GenerateRequest(PROMPT, SamplingParams(max_new_tokens=12, ignore_eos=True), rid="ep-1")
            )
        finally:
            await client.aclose()

    r = asyncio.run(go())
    assert len(r.output_ids) == len(r.output_logprobs) == len(r.output_versions) == 12
    assert r.output_versions == [0] * 12 and r.finish_reason == "length" and r.n_interruptions == 0
    assert r.rid == "ep-1" and r.server == cpu_server.addresses[0] and r.input_ids == PROMPT
    check_logprobs(r, tiny_model_dir, inference_lib)


def test_pause_mid_generation_resumes_within_the_token_budget(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    addr = cpu_server.addresses[0]

    async def go() -> tuple[GenerateResult, GenerateResult]:
        client = EngineClient(cpu_server.addresses)
        try:
            task = asyncio.create_task(client.agenerate(greedy(400)))
            await wait_tokens(addr, 30)
            await asyncio.to_thread(client.pause)  # the synchronous baseline's blocking pause
            await asyncio.sleep(0.3)
            assert not task.done()  # the resubmitted segment waits at the paused server
            await asyncio.to_thread(client.resume)
            interrupted = await task
            return interrupted, await client.agenerate(greedy(400))
        finally:
            await client.aclose()

    interrupted, straight = asyncio.run(go())
    assert interrupted.n_interruptions >= 1 and straight.n_interruptions == 0
    assert len(interrupted.output_ids) == 400 and interrupted.finish_reason == "length"
    # Greedy with the same weights: the resumed run (prefix KV recomputed) equals the straight run.
    assert interrupted.output_ids == straight.output_ids
    check_logprobs(interrupted, tiny_model_dir, inference_lib)


def test_agenerate_many_batches_the_first_segment_and_resumes_each_member(
    cpu_server: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    """A group goes out as one batched /generate; a pause mid-batch returns partial outputs, and each
    member resumes on its own to the same tokens as an uninterrupted greedy run."""
    addr = cpu_server.addresses[0]
    prompts = [PROMPT, [9, 10, 11], PROMPT]
    sp = SamplingParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)

    async def go() -> tuple[list[GenerateResult], list[GenerateResult], dict[str, int]]:
        client = EngineClient(cpu_server.addresses)
        try:
            task = asyncio.create_task(
                client.agenerate_many([GenerateRequest(p, sp, rid=f"g-{i}") for i, p in enumerate(prompts)])
            )
            await wait_tokens(addr, 60)
            await asyncio.to_thread(client.pause)
            await asyncio.sleep(0.2)
            await asyncio.to_thread(client.resume)
            batched = await task
            counters = dict(client.counters)
            straight = [await client.agenerate(GenerateRequest(p, sp)) for p in prompts]
            return batched, straight, counters
        finally:
            await client.aclose()

    batched, straight, counters = asyncio.run(go())
    assert [r.rid for r in batched] == ["g-0", "g-1", "g-2"]
    assert [r.input_ids for r in batched] == prompts
    assert counters["requests"] == 3
    # One batched segment, then one continuation per interrupted member (not three first segments).
    assert counters["segments"] == 1 + sum(r.n_interruptions for r in batched)
    assert any(r.n_interruptions >= 1 for r in batched)
    for r, ref in zip(batched, straight, strict=True):
        assert r.finish_reason == "length" and len(r.output_ids) == 300
        assert r.output_ids == ref.output_ids  # greedy, same weights: the resumed run equals the straight one
        assert len(r.output_logprobs) == len(r.output_versions) == 300
    check_logprobs(batched[1], tiny_model_dir, inference_lib)


def test_agenerate_many_with_different_sampling_sends_each_alone(cpu_server: Any) -> None:
    async def go() -> tuple[list[GenerateResult], dict[str, int]]:
        client = EngineClient(cpu_server.addresses)
        try:
            out = await client.agenerate_many([greedy(5, rid="a"), greedy(7, rid="b")])
            return out, dict(client.counters)
        finally:
            await client.aclose()

    out, counters = asyncio.run(go())
    assert [len(r.output_ids) for r in out] == [5, 7] and [r.rid for r in out] == ["a", "b"]
    assert counters["requests"] == 2 and counters["segments"] == 2


def test_bad_request_raises_at_once_without_retries(cpu_server: Any) -> None:
    async def go() -> EngineClient:
        client = EngineClient(cpu_server.addresses, retry_backoff_s=0.01)
        try:
            with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
                await client.agenerate(GenerateRequest([3, 99_999], SamplingParams(max_new_tokens=2)))
            return client
        finally:
            await client.aclose()

    assert asyncio.run(go()).counters["segments"] == 1


def test_unreachable_servers_raise_server_unavailable() -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]

    async def go() -> None:
        client = EngineClient(dead, max_retries=1, retry_backoff_s=0.01, connect_timeout_s=1.0)
        try:
            await client.agenerate(greedy(4))
        finally:
            await client.aclose()

    t0 = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="no server completed the request after 2 rounds over 2"):
        asyncio.run(go())
    assert time.monotonic() - t0 < 5


def test_server_pool_affinity_lru_least_loaded_and_cooldown() -> None:
    now = [0.0]
    pool = ServerPool(["a", "b", "c"], affinity_lru_size=2, down_cooldown_s=5.0, clock=lambda: now[0])
    pool.acquire("a")
    pool.acquire("a")
    pool.acquire("b")
    assert pool.pick("new") == "c"  # loads a=2, b=1, c=0
    pool.remember("r1", "a")
    pool.remember("r2", "b")
    assert pool.pick("r1") == "a"  # affinity beats load; r1 becomes most recent
    pool.remember("r3", "c")  # LRU of size 2 forgets r2
    assert pool.affinity("r2") is None and pool.affinity("r1") == "a"
    pool.mark_down("a")
    assert pool.pick("r1") == "c"  # pinned server down: least loaded up server instead
    assert pool.pick("r1", exclude={"b", "c"}) == "a"  # only down servers left: try them anyway
    now[0] = 6.0
    assert pool.pick("r1") == "a"  # cooldown over
    assert pool.pick("x", exclude={"a", "b", "c"}) is None


@pytest.fixture(scope="module")
def two_servers(cpu_server: Any, tiny_model_dir: Path, inference_lib: Any) -> Any:
    """The session server plus one of this module's own (index 0; the failover test kills it)."""
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as extra:
        yield SimpleNamespace(own=extra, addresses=[extra.addresses[0], cpu_server.addresses[0]])


def test_rid_affinity_and_least_loaded_spread(two_servers: Any) -> None:
    async def go() -> tuple[set[str], list[str]]:
        client = EngineClient(two_servers.addresses)
        try:
            spread = await asyncio.gather(*(client.agenerate(greedy(40)) for _ in range(6)))
            turns = [(await client.agenerate(greedy(3, rid="episode-9"))).server for _ in range(4)]
            return {r.server for r in spread}, turns
        finally:
            await client.aclose()

    servers_used, turns = asyncio.run(go())
    assert servers_used == set(two_servers.addresses)  # concurrent requests go to the least loaded
    assert len(set(turns)) == 1  # one episode's turns stay on one server


def test_failover_resumes_from_partial_output_when_a_server_dies(
    two_servers: Any, tiny_model_dir: Path, inference_lib: Any
) -> None:
    """Server A returns a partial (paused), then dies while the client waits on it: B finishes the rest."""
    a, b = two_servers.addresses

    async def go() -> tuple[GenerateResult, GenerateResult]:
        client = EngineClient([a, b], retry_backoff_s=0.05, max_retries=2)
        try:
            client.pool.acquire(b)  # make A the least loaded, so the request starts there
            task = asyncio.create_task(client.agenerate(greedy(600, rid="ep-failover")))
            await wait_tokens(a, 40)
            client.pool.release(b)
            await asyncio.to_thread(control_call, a, "/pause_generation", {"mode": "abort"})
            await asyncio.sleep(0.2)  # the client has the partial and re-submitted to A, which holds it
            await asyncio.to_thread(two_servers.own.kill, 0)
            result = await task
            return result, await client.agenerate(greedy(600))
        finally:
            await client.aclose()

    result, reference = asyncio.run(go())
    assert result.server == b and result.finish_reason == "length"
    assert result.n_interruptions >= 2  # the pause and the failover
    assert len(result.output_ids) == 600 and result.output_ids == reference.output_ids
    check_logprobs(result, tiny_model_dir, inference_lib)


def test_pool_skips_restarting_and_dropped_servers() -> None:
    """Unit: a server being restarted is not picked until it is back; a dropped one never again."""
    pool = ServerPool(["a:1", "b:2"])
    pool.set_restarting("a:1", True)
    assert pool.restarting() and {pool.pick(f"r{i}") for i in range(6)} == {"b:2"}
    assert pool.pick("r", exclude=["b:2"]) is None  # no fallback to a server that is known dead
    pool.set_restarting("a:1", False)
    assert not pool.restarting() and pool.pick("r", exclude=["b:2"]) == "a:1"
    pool.drop("b:2", "gave up")
    assert pool.live_addresses == ["a:1"] and pool.dropped() == {"b:2": "gave up"} and pool.is_down("b:2")
    pool.set_restarting("b:2", True)  # a dropped server is not restarting either
    assert not pool.restarting() and pool.pick("r", exclude=["a:1"]) is None
