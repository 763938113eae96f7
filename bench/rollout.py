"""Rollout benchmark: what the WorkflowExecutor costs over calling the inference servers directly.

Run:  .venv/bin/python -m bench.rollout            (about 1-2 minutes on 2 cores)
      .venv/bin/python -m bench.rollout --quick    (fewer repetitions, smoke run)

Prints one `name value` line per figure and writes them to bench/results/rollout.json (raw numbers in
rollout_details.json). Both sides send the same requests (the chat-templated prompts of the synthetic
task, `ignore_eos` so every request generates exactly `--tokens` tokens) to the same local CPU server,
with the same number of requests in flight:

- executor_vs_server_tokens: generated tokens/s through the full rollout path -- WorkflowExecutor
  (staleness accounting, scheduling) running RLVRWorkflow (chat template, `group_size` samples per
  prompt, reward scoring, row building) and writing every accepted group as Parquet shards with commit
  records to a local store -- over tokens/s of `--concurrency` direct concurrent `agenerate` calls.
  Target >= 0.9. Median over interleaved repetitions.
- agent_calls_per_s, agent_call_overhead_ms (and _frac), agent_vs_direct_calls: a chat call through the
  per-episode OpenAI endpoint with the official ``openai`` client, against a direct ``agenerate``
  (``bench.agent_endpoint``, which also runs on its own).

The model is the embedded default's tiny Llama (`rollflow.models`, no warm start: only token counts
matter here). This is a script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import agent_endpoint
from bench._common import report, unwarmed_tiny_model
from rollflow.api.config import InferenceConfig
from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.rewards import AsyncRewardRunner
from rollflow.rewards.synthetic import synthetic_reward_fn
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.staleness import StalenessManager
from rollflow.workflows.blocks import render_chat
from rollflow.workflows.rlvr import RLVRWorkflow
from storage.fs import Storage
from storage.shard_writer import ShardWriter


def prompts(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        rows.append({"prompt_id": f"b{seed}-{i}", "messages": [{"role": "user", "content": f"{a}+{b}=?"}],
                     "answer": str(a + b)})  # fmt: skip
    return rows


async def direct(
    addresses: list[str], prompt_ids: list[list[int]], sp: SamplingParams, concurrency: int
) -> dict:
    client = EngineClient(addresses)
    sem = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(ids: list[int]) -> None:
        nonlocal tokens
        async with sem:
            res = await client.agenerate(GenerateRequest(ids, sp))
            tokens += len(res.output_ids)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(one(ids) for ids in prompt_ids))
    finally:
        await client.aclose()
    elapsed = time.perf_counter() - t0
    return {"tokens": tokens, "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed}


async def through_executor(
    addresses: list[str], rows: list[dict], workflow: RLVRWorkflow, concurrency: int, store: Storage
) -> dict:
    client = EngineClient(addresses)
    episodes = max(1, concurrency // workflow.group_size)  # same requests in flight as the direct side
    staleness = StalenessManager(episodes, max_staleness=10**6, consumer_batch_size=len(rows))
    writer = ShardWriter(store, "bench", flush_rows=64, flush_seconds=1.0)
    executor = WorkflowExecutor(workflow, client, staleness, writer=writer)
    t0 = time.perf_counter()
    try:
        async with executor:
            executor.feed(iter(enumerate(rows)))
            await executor.await_idle()
        await asyncio.to_thread(writer.close)
    finally:
        await client.aclose()
    elapsed = time.perf_counter() - t0
    st = executor.stats
    return {
        "tokens": st.tokens, "elapsed_s": elapsed, "tokens_per_s": st.tokens / elapsed, "accepted": st.accepted,
        "failed": st.failed, "rows_written": writer.stats["rows"], "shards": writer.stats["shards"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions of fewer prompts")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=48, help="prompts per repetition")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight on both sides")
    ap.add_argument("--tokens", type=int, default=24, help="generated tokens per request")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.prompts = 2, 16
    load_start = os.getloadavg()[0]  # other work on the machine makes single runs noisy
    from transformers import AutoTokenizer

    from infra.servers import launch_local_servers

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = unwarmed_tiny_model(Path(tmp) / "model")
        tok = AutoTokenizer.from_pretrained(model_dir)
        sp = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, ignore_eos=True)
        runner = AsyncRewardRunner(synthetic_reward_fn, max_workers=1, timeout_s=10.0)
        workflow = RLVRWorkflow(
            lambda *a, **k: 0.0, tok, sp, group_size=args.group_size, reward_runner=runner
        )
        store = Storage.open(str(Path(tmp) / "store"), "bench", "rollout", {})
        icfg = InferenceConfig(n_servers=1, server_threads=1, max_batch_size=64)
        runs: dict[str, list[dict]] = {"direct": [], "executor": []}
        with launch_local_servers(icfg, model_dir) as servers:
            warm = prompts(8, seed=-1)
            asyncio.run(through_executor(servers.addresses, warm, workflow, args.concurrency, store))
            for rep in range(args.reps):
                rows = prompts(args.prompts, seed=rep)
                ids = [
                    tok.encode(
                        render_chat(tok, r["messages"], add_generation_prompt=True), add_special_tokens=False
                    )
                    for r in rows
                    for _ in range(args.group_size)
                ]
                order = ["direct", "executor"] if rep % 2 == 0 else ["executor", "direct"]
                for side in order:
                    if side == "direct":
                        out = asyncio.run(direct(servers.addresses, ids, sp, args.concurrency))
                    else:
                        out = asyncio.run(
                            through_executor(servers.addresses, rows, workflow, args.concurrency, store)
                        )
                    runs[side].append(out)
            # The agent endpoint (bench.agent_endpoint) on the same server: calls/s and added latency.
            agent_figures, agent_details = agent_endpoint.run(
                servers.addresses, tok, reps=1 if args.quick else 3, tokens=args.tokens,
                calls=10 if args.quick else 30, concurrency=args.concurrency,
            )  # fmt: skip
        runner.close()
    med = {side: statistics.median(r["tokens_per_s"] for r in rs) for side, rs in runs.items()}
    # Paired: each repetition runs both sides back to back, so drift from other load on the machine
    # cancels within a pair; the figure is the median of the per-repetition ratios.
    paired = [
        e["tokens_per_s"] / d["tokens_per_s"] for e, d in zip(runs["executor"], runs["direct"], strict=True)
    ]
    figures = {"executor_vs_server_tokens": statistics.median(paired), **agent_figures}
    details = {
        "agent_endpoint": agent_details,
        "args": vars(args), "median_tokens_per_s": med, "paired_ratios": paired,
        "ratio_of_medians": med["executor"] / med["direct"],
        "paired_ratio_quartiles": statistics.quantiles(paired, n=4) if len(paired) > 1 else paired,
        "load_avg_1m_start_end": [load_start, os.getloadavg()[0]], "runs": runs,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
    }  # fmt: skip
    report("rollout", figures, details)


if __name__ == "__main__":
    main()
