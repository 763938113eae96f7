"""Score the policy the inference servers currently serve on held-out prompts.

What it is: ``aevaluate`` renders each prompt with the chat template, generates (greedy by default)
through any ``InferenceClient`` concurrently, scores completions with the task's verifiable reward
and returns accuracy (share of completions with reward >= ``correct_threshold``) plus the decoded rows.
What it is not: a trainer-side evaluation (it uses the servers, so it measures exactly what rollout
samples from), and it does not log anywhere; callers send ``EvalResult`` to MLflow/Prefect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.inference import GenerateRequest, InferenceClient, SamplingParams
from rollflow.workflows.rlvr import render_chat

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    accuracy: float
    mean_reward: float
    n: int
    versions: dict[int, int]  # policy version -> number of completions generated under it
    seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def version(self) -> int:
        """The policy version most completions came from."""
        return max(self.versions, key=lambda v: self.versions[v]) if self.versions else -1


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids, rendered exactly as ``RLVRWorkflow`` renders rollout prompts."""
    text = render_chat(tokenizer, messages, add_generation_prompt=True)
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


async def aevaluate(
    client: InferenceClient,
    tokenizer: Any,
    prompts: Sequence[dict[str, Any]],
    reward_fn: Callable[..., float],
    *,
    sampling: SamplingParams,
    concurrency: int = 64,
    correct_threshold: float = 1.0,
) -> EvalResult:
    if not prompts:
        raise ValueError("evaluation needs at least one prompt; check eval.n_prompts and dataset.eval_split")
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()

    async def one(i: int, row: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = render_prompt(tokenizer, row["messages"])
        async with sem:
            res = await client.agenerate(
                GenerateRequest(input_ids=prompt_ids, sampling=sampling, rid=f"eval-{row['prompt_id']}-{i}")
            )
        completion = tokenizer.decode(res.output_ids, skip_special_tokens=True)
        prompt_text = row["messages"][-1]["content"]
        extra = {k: v for k, v in row.items() if k not in ("prompt_id", "messages", "answer")}
        try:
            reward = float(reward_fn(prompt_text, completion, str(row["answer"]), **extra))
        except Exception as exc:  # a broken reward scores 0, as in rollout
            log.warning("reward raised on eval prompt %s: %s", row["prompt_id"], exc)
            reward = 0.0
        version = max(res.output_versions) if res.output_versions else -1
        return {
            "prompt_id": row["prompt_id"],
            "prompt": prompt_text,
            "completion": completion,
            "answer": str(row["answer"]),
            "reward": reward,
            "version": version,
        }

    rows = await asyncio.gather(*(one(i, r) for i, r in enumerate(prompts)))
    rewards = [r["reward"] for r in rows]
    return EvalResult(
        accuracy=sum(r >= correct_threshold for r in rewards) / len(rows),
        mean_reward=sum(rewards) / len(rows),
        n=len(rows),
        versions=dict(Counter(r["version"] for r in rows)),
        seconds=time.perf_counter() - start,
        rows=list(rows),
    )
