"""Score the policy the inference servers currently serve on held-out prompts.

What it is:

* ``aevaluate`` renders each prompt with the chat template, generates (greedy by default) through any
  ``InferenceClient`` concurrently, scores completions with the task's verifiable reward and returns
  accuracy (share of completions with reward >= ``correct_threshold``, ``eval.correct_reward``), the
  mean reward, whether the rewards were binary (``rollflow.eval_scores``) plus the decoded rows.
  Rewards are scored exactly as in rollout: by a ``RewardScorer`` (``rollflow.rewards.AsyncRewardRunner``,
  worker processes with a timeout), never in-process on the event loop. math-verify's own timeouts
  use ``signal.alarm`` and are off away from the main thread, so an in-process call on
  ``\\boxed{9^{9^{9^{9}}}}`` would hang evaluation; a runner kills the worker after
  ``rollout.reward_timeout_s``. A reward that errs, times out or gets no worker scores 0 and is
  counted in ``EvalResult.reward_errors`` / ``reward_timeouts``; the runner refuses non-numbers, so a
  reward function returning ``"1.0"`` counts as an error, not as correct.
* ``served_version`` / ``wait_for_served_version``: the version every server serves (the minimum over
  servers), polled until it reaches a target, so "after training" really scores the final policy.
* ``arun_eval(cfg, addresses)``: the whole evaluation of one config, as the Prefect tasks in
  ``tasks/evaluate.py`` call it; the result names its evaluation set by the digest of its rows
  (``EvalResult.eval_set``), so scores of different sets are never compared.

What it is not: a trainer-side evaluation (it uses the servers, so it measures exactly what rollout
samples from), and it does not log anywhere; callers send ``EvalResult`` to MLflow/Prefect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollflow.api.inference import GenerateRequest, InferenceClient, SamplingParams
from rollflow.api.rewards import RewardScorer
from rollflow.eval_scores import EvalResult, eval_set_digest, score_rewards
from rollflow.inference.contract import Engine
from rollflow.inference.sglang import SGLangEngine
from rollflow.workflows.blocks import render_chat

if TYPE_CHECKING:
    from rollflow.api.config import ExperimentConfig

log = logging.getLogger(__name__)


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids, rendered exactly as ``RLVRWorkflow`` renders rollout prompts."""
    text = render_chat(tokenizer, messages, add_generation_prompt=True)
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


async def aevaluate(
    client: InferenceClient,
    tokenizer: Any,
    prompts: Sequence[dict[str, Any]],
    scorer: RewardScorer,
    *,
    sampling: SamplingParams,
    concurrency: int = 64,
    correct_threshold: float = 1.0,
) -> EvalResult:
    """Generate one completion per prompt and score it with ``scorer`` (see the module docstring)."""
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
        outcome = await scorer.ascore(prompt_text, completion, str(row["answer"]), **extra)
        failed = bool(outcome.error or outcome.timed_out)
        version = max(res.output_versions) if res.output_versions else -1
        return {
            "prompt_id": row["prompt_id"],
            "prompt": prompt_text,
            "completion": completion,
            "answer": str(row["answer"]),
            "reward": 0.0 if failed else float(outcome.score),
            "version": version,
            "reward_error": (str(outcome.error)[:300] if outcome.error else None),
            "reward_timed_out": bool(outcome.timed_out),
        }

    rows = await asyncio.gather(*(one(i, r) for i, r in enumerate(prompts)))
    rewards = [r["reward"] for r in rows]
    timeouts = sum(r["reward_timed_out"] for r in rows)
    errors = sum(r["reward_error"] is not None for r in rows) - timeouts
    if errors or timeouts:
        log.warning("eval: %d reward errors and %d timeouts scored 0 (of %d)", errors, timeouts, len(rows))
    accuracy, mean_reward, binary = score_rewards(rewards, correct_threshold)
    return EvalResult(
        accuracy=accuracy,
        mean_reward=mean_reward,
        binary=binary,
        n=len(rows),
        versions=dict(Counter(r["version"] for r in rows)),
        seconds=time.perf_counter() - start,
        rows=list(rows),
        reward_errors=errors,
        reward_timeouts=timeouts,
    )


# --- served versions ------------------------------------------------------------------------------


def served_version(
    addresses: list[str], api_key: str | None, *, timeout_s: float = 10.0, engine: Engine | None = None
) -> int:
    """The lowest ``weight_version`` the servers report (a non-integer version counts as 0), -1 for none.

    ``engine``: the servers' (``rollflow.inference.engines.engine_for``); SGLang's protocol if omitted.

    Raises:
        InferenceError: a server did not answer.
    """
    eng = engine if engine is not None else SGLangEngine()
    parsed = []
    for address in addresses:
        version = str(eng.served_version(address, api_key=api_key, timeout_s=timeout_s))
        parsed.append(int(version) if version.lstrip("-").isdigit() else 0)
    return min(parsed) if parsed else -1


def wait_for_served_version(
    addresses: list[str],
    api_key: str | None,
    min_version: int,
    *,
    timeout_s: float = 300.0,
    engine: Engine | None = None,
) -> int:
    """Poll every 0.5 s until every server serves ``>= min_version``; returns the served version.

    Raises:
        TimeoutError: still older after ``timeout_s``; the message says what to check.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        served = served_version(addresses, api_key, engine=engine)
        if served >= min_version:
            return served
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"servers still serve version {served} after {timeout_s:.0f}s, expected >= {min_version}; "
                "is the checkpoint watcher running and can it read storage?"
            )
        time.sleep(0.5)


# --- one evaluation of a config -------------------------------------------------------------------


async def arun_eval(cfg: ExperimentConfig, addresses: list[str]) -> EvalResult:
    """Greedy (unless ``eval.greedy`` is off) accuracy of the policy the servers serve now."""
    from transformers import AutoTokenizer

    from rollflow.evaluation.agent import aevaluate_agent, is_agent_workflow
    from rollflow.inference.client import EngineClient
    from rollflow.rewards.inprocess import reward_runner_for
    from rollflow.workflows.factory import sampling_params

    prompts = eval_prompts(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    sampling = sampling_params(cfg)  # the rollout's parameters, greedy unless eval.greedy is off
    sampling.max_new_tokens = cfg.eval.max_new_tokens or sampling.max_new_tokens
    if cfg.eval.greedy:
        sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p = 0.0, 1.0, -1, 0.0
    client = EngineClient.from_config(cfg.inference, addresses)
    try:
        if is_agent_workflow(cfg.rollout.workflow):  # an agent is scored by running it, episode by episode
            result = await aevaluate_agent(cfg, client, prompts, sampling)
            rewards = [float(r["reward"]) for r in result.rows]
            result.accuracy, result.mean_reward, result.binary = score_rewards(
                rewards, cfg.eval.correct_reward
            )
        else:
            async with reward_runner_for(
                cfg.dataset.reward_fn,
                max_workers=cfg.rollout.reward_workers,
                timeout_s=cfg.rollout.reward_timeout_s,
            ) as scorer:
                result = await aevaluate(
                    client,
                    tokenizer,
                    prompts,
                    scorer,
                    sampling=sampling,
                    correct_threshold=cfg.eval.correct_reward,
                )
    finally:
        await client.aclose()
    result.eval_set = eval_set_digest(prompts)
    return result


def eval_prompts(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The held-out rows an evaluation of ``cfg`` scores: ``eval.split`` (default ``dataset.eval_split``),
    the first ``eval.n_prompts`` of them (0 = all)."""
    from rollflow.data import load_prompts

    prompts = load_prompts(cfg.dataset, cfg.eval.split or cfg.dataset.eval_split)
    return prompts[: cfg.eval.n_prompts] if cfg.eval.n_prompts else prompts
