"""Agent endpoint benchmark: what a call through the per-episode OpenAI endpoint costs over a direct engine call.

Run:  .venv/bin/python -m bench.agent_endpoint            (about a minute on 2 cores)
      .venv/bin/python -m bench.agent_endpoint --quick    (smoke run)

Both sides send the same chat prompt (the tiny model's template, one user turn) to the same local CPU
server, generating exactly ``--tokens`` tokens (``ignore_eos``):

- direct: ``EngineClient.agenerate`` with the templated prompt ids;
- endpoint: the official ``openai.AsyncOpenAI`` client -> ``AgentEndpoint`` (chat template, tokenization,
  admission, recording, OpenAI reply) -> the same ``EngineClient``; all in this process, as in a rollout;
- endpoint_raw: a bare aiohttp POST to the endpoint (the endpoint's cost without the openai library's).

Figures: ``agent_call_overhead_ms`` (median latency of one call at a time, endpoint minus direct),
``agent_call_overhead_frac`` (that over the direct call's latency), ``agent_calls_per_s`` (calls/s
through the endpoint with ``--concurrency`` calls in flight) and ``agent_vs_direct_calls`` (over the
direct calls/s at the same concurrency). Repetitions alternate the sides. This is a script, not a test;
``bench.rollout`` prints the same figures (``run`` below).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench._common import report, unwarmed_tiny_model
from rollflow.agents.endpoint import AgentEndpoint
from rollflow.agents.recorder import EpisodeLimits
from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.inference.client import EngineClient

MESSAGES = [{"role": "user", "content": "What is 12+35?"}]
UNLIMITED = EpisodeLimits(max_turns=10**9, max_episode_tokens=10**12)


async def _sides(
    addresses: list[str], tok: Any, tokens: int, calls: int, concurrency: int, rep: int
) -> dict[str, Any]:
    """One repetition of every side; returns per-side latencies (sequential) and calls/s (concurrent)."""
    import openai

    sp = SamplingParams(max_new_tokens=tokens, temperature=1.0, ignore_eos=True)
    client = EngineClient(addresses)
    endpoint = AgentEndpoint(tok, sampling=sp)
    await endpoint.astart()
    ids = endpoint.prompter.full_ids(MESSAGES, None)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": tokens, "ignore_eos": True}
    handles = [endpoint.open_episode(client, UNLIMITED) for _ in range(concurrency)]
    oas = [openai.AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, max_retries=0) for h in handles]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def direct(i: int) -> None:
        res = await client.agenerate(GenerateRequest(list(ids), sp))
        assert len(res.output_ids) == tokens

    async def via_openai(i: int) -> None:
        r = await oas[i].chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=tokens, extra_body={"ignore_eos": True}
        )
        assert r.usage is not None and r.usage.completion_tokens == tokens

    async def via_raw(i: int) -> None:
        h = handles[i]
        async with session.post(
            h.base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {h.api_key}"}
        ) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()

    sides = [("direct", direct), ("endpoint", via_openai), ("endpoint_raw", via_raw)]
    fns = dict(sides[rep % 3 :] + sides[: rep % 3])  # each repetition starts with another side
    out: dict[str, Any] = {"latency_ms": {}, "calls_per_s": {}}
    try:
        for fn in fns.values():
            await fn(0)  # warm: connections, first template render
        for name, fn in fns.items():
            lat = []
            for _ in range(calls):
                t0 = time.perf_counter()
                await fn(0)
                lat.append((time.perf_counter() - t0) * 1000)
            out["latency_ms"][name] = statistics.median(lat)
        for name, fn in fns.items():
            per_worker = max(1, calls * 2 // concurrency)

            async def worker(i: int, fn: Any = fn, n: int = per_worker) -> None:
                for _ in range(n):
                    await fn(i)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(concurrency)))
            out["calls_per_s"][name] = per_worker * concurrency / (time.perf_counter() - t0)
    finally:
        for oa in oas:
            await oa.close()
        await session.close()
        await endpoint.aclose()
        await client.aclose()
    return out


def run(
    addresses: list[str], tok: Any, *, reps: int, tokens: int, calls: int, concurrency: int
) -> tuple[dict, dict]:
    """(figures, details) over ``reps`` repetitions against running servers."""
    runs = [asyncio.run(_sides(addresses, tok, tokens, calls, concurrency, rep)) for rep in range(reps)]
    lat = {s: statistics.median(r["latency_ms"][s] for r in runs) for s in runs[0]["latency_ms"]}
    cps = {s: statistics.median(r["calls_per_s"][s] for r in runs) for s in runs[0]["calls_per_s"]}
    overhead = lat["endpoint"] - lat["direct"]
    figures = {
        "agent_calls_per_s": cps["endpoint"],
        "agent_call_overhead_ms": overhead,
        "agent_call_overhead_frac": overhead / lat["direct"],
        "agent_vs_direct_calls": cps["endpoint"] / cps["direct"],
    }
    details = {"median_latency_ms": lat, "median_calls_per_s": cps, "runs": runs}
    return figures, details


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40, help="sequential calls per side and repetition")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=24, help="generated tokens per call")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.calls = 1, 10
    from transformers import AutoTokenizer

    from infra.servers import launch_local_servers
    from rollflow.api.config import InferenceConfig

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = unwarmed_tiny_model(Path(tmp) / "model")
        tok = AutoTokenizer.from_pretrained(model_dir)
        icfg = InferenceConfig(n_servers=1, server_threads=1, max_batch_size=64)
        with launch_local_servers(icfg, model_dir) as servers:
            figures, details = run(
                servers.addresses, tok, reps=args.reps, tokens=args.tokens, calls=args.calls,
                concurrency=args.concurrency,
            )  # fmt: skip
    report("agent_endpoint", figures, {"args": vars(args), **details})


if __name__ == "__main__":
    main()
