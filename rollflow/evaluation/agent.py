"""Held-out evaluation of an agent run: the user's agent, greedy, one episode per prompt.

What it is. ``aevaluate_agent(cfg, client, prompts, sampling)`` builds the run's ``AgentWorkflow``
(``rollout.workflow`` + ``workflow_kwargs``) with the evaluation's sampling (greedy unless
``eval.greedy`` is off), one episode per prompt and no per-episode staleness bound, runs the agent on
each held-out row through its own endpoint, and returns an ``EvalResult`` like the single-turn
evaluation's: accuracy is the share of episodes whose reward (the agent's, or ``reward_fn`` on the
final transcript) is at least 1.0; a dropped episode (the agent raised, timed out, broke a limit)
scores 0 and counts in ``reward_errors``. ``rollflow.evaluation.arun_eval`` calls it when
``rollout.workflow`` is an ``AgentWorkflow``: a single completion of the first turn would not say
whether an agent succeeds.

What it is not: a trainer-side evaluation, and nothing is trained: the episodes' rows are discarded.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollflow.api.inference import InferenceClient, SamplingParams
from rollflow.api.workflow import import_string
from rollflow.eval_scores import EvalResult

if TYPE_CHECKING:
    from rollflow.api.config import ExperimentConfig


def is_agent_workflow(spec: str) -> bool:
    """``rollout.workflow`` names ``AgentWorkflow`` or a subclass."""
    from rollflow.workflows.agent import AgentWorkflow

    target = import_string(spec)
    return isinstance(target, type) and issubclass(target, AgentWorkflow)


async def aevaluate_agent(
    cfg: ExperimentConfig,
    client: InferenceClient,
    prompts: Sequence[dict[str, Any]],
    sampling: SamplingParams,
    *,
    concurrency: int = 64,
) -> EvalResult:
    """Run the agent once per prompt (module docstring)."""
    from rollflow.workflows.agent import AgentWorkflow

    if not prompts:
        raise ValueError("evaluation needs at least one prompt; check eval.n_prompts and dataset.eval_split")
    cls = import_string(cfg.rollout.workflow)
    kwargs: dict[str, Any] = {
        "reward_fn": cfg.dataset.reward_fn,
        "reward_workers": cfg.rollout.reward_workers,
        "reward_timeout_s": cfg.rollout.reward_timeout_s,
        **cfg.rollout.workflow_kwargs,
        "tokenizer": cfg.model.path,
        "sampling": sampling,
        "group_size": 1,
        "max_staleness": None,  # the served policy is the one scored: nothing is stale here
    }
    wf: AgentWorkflow = cls(**kwargs)
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with sem:
            handle, rows = await wf.arun_recorded(client, row)
        rec = handle.recorder
        transcript = rec.transcript()
        last = transcript[-1].get("content") if transcript else (rec.calls[-1].text if rec.calls else "")
        versions = [v for c in rec.calls for v in c.versions]
        return {
            "prompt_id": row["prompt_id"],
            "prompt": str(row["messages"][-1]["content"]) if row.get("messages") else "",
            "completion": str(last or ""),
            "answer": str(row.get("answer")),
            "reward": float(rows[0].reward) if rows else 0.0,
            "version": max(versions) if versions else -1,
            "reward_error": None if rows else f"episode dropped: {rec.drop_reason}",
            "reward_timed_out": rec.drop_reason == "timeout",
            "turns": len(rec.calls),
        }

    try:
        results = await asyncio.gather(*(one(dict(r)) for r in prompts))
    finally:
        await wf.aclose()
    rewards = [r["reward"] for r in results]
    return EvalResult(
        accuracy=sum(r >= 1.0 for r in rewards) / len(results),
        mean_reward=sum(rewards) / len(results),
        n=len(results),
        versions=dict(Counter(r["version"] for r in results)),
        seconds=time.perf_counter() - start,
        rows=list(results),
        reward_errors=sum(r["reward_error"] is not None for r in results),
        reward_timeouts=sum(r["reward_timed_out"] for r in results),
    )
