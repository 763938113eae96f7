"""Tasks: score the served policy on held-out prompts, once or every n versions while training runs.

``evaluate_policy`` waits until every server serves at least ``min_version`` (so "after" really is the
final policy), scores ``eval.n_prompts`` held-out prompts greedily and writes a Prefect table artifact.
``eval_loop`` repeats that every ``eval.every_n_versions`` published versions until stopped.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import InferenceError
from rollflow.api.metrics import MetricsSink
from tasks.runtime import run_sync
from tasks.tracking import PrefixSink, table_artifact


def _served_version(addresses: list[str], api_key: str | None) -> int:
    from infra.control import ServerControl

    versions = ServerControl(addresses, api_key=api_key, timeout_s=10).weight_versions()
    parsed = [int(v) if v.lstrip("-").isdigit() else 0 for v in versions.values()]
    return min(parsed) if parsed else -1


def wait_for_served_version(
    cfg: ExperimentConfig, addresses: list[str], min_version: int, timeout_s: float = 300.0
) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        served = _served_version(addresses, cfg.inference.api_key)
        if served >= min_version:
            return served
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"servers still serve version {served} after {timeout_s:.0f}s, expected >= {min_version}; "
                "is the checkpoint watcher running and can it read storage?"
            )
        time.sleep(0.5)


def run_eval(cfg: ExperimentConfig, addresses: list[str]) -> Any:
    """Core call (no Prefect): greedy accuracy of the currently served policy."""
    from transformers import AutoTokenizer

    from rollflow.api.workflow import import_string
    from rollflow.data import load_prompts
    from rollflow.evaluation import aevaluate
    from rollflow.rollout.client import SGLangClient
    from rollflow.rollout.loop import sampling_params

    prompts = load_prompts(cfg.dataset, cfg.eval.split or cfg.dataset.eval_split)
    if cfg.eval.n_prompts:
        prompts = prompts[: cfg.eval.n_prompts]
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    sampling = sampling_params(cfg)  # the rollout's parameters, greedy unless eval.greedy is off
    sampling.max_new_tokens = cfg.eval.max_new_tokens or sampling.max_new_tokens
    if cfg.eval.greedy:
        sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p = 0.0, 1.0, -1, 0.0
    reward_fn = import_string(cfg.dataset.reward_fn)

    async def go() -> Any:
        client = SGLangClient.from_config(cfg.inference, addresses)
        try:
            return await aevaluate(client, tokenizer, prompts, reward_fn, sampling=sampling)
        finally:
            await client.aclose()

    return run_sync(go())


@task(name="evaluate-policy", cache_policy=NO_CACHE, persist_result=False, task_run_name="evaluate-{label}")
def evaluate_policy(
    cfg: ExperimentConfig,
    addresses: list[str],
    *,
    label: str,
    min_version: int = 0,
    metrics: MetricsSink | None = None,
) -> dict[str, Any]:
    logger = get_run_logger()
    wait_for_served_version(cfg, addresses, min_version)
    result = run_eval(cfg, addresses)
    logger.info(
        "eval %s: accuracy %.3f on %d prompts (version %d, %.1fs)",
        label,
        result.accuracy,
        result.n,
        result.version,
        result.seconds,
    )
    PrefixSink(metrics, "eval/").log(
        {"accuracy": result.accuracy, "mean_reward": result.mean_reward}, step=result.version
    )
    table_artifact(
        result.rows[:50],
        key=f"eval-{label}".replace("_", "-").lower(),
        description=f"Greedy eval ({label}) of policy v{result.version}: accuracy {result.accuracy:.3f}",
    )
    return {
        "label": label,
        "accuracy": result.accuracy,
        "mean_reward": result.mean_reward,
        "n": result.n,
        "version": result.version,
        "rows": result.rows,
    }


@task(name="eval-loop", cache_policy=NO_CACHE, persist_result=False)
def eval_loop(
    cfg: ExperimentConfig,
    addresses: list[str],
    *,
    metrics: MetricsSink | None = None,
    stop_event: threading.Event,
) -> list[dict[str, Any]]:
    """Evaluate every ``eval.every_n_versions`` served versions until ``stop_event`` is set."""
    every = cfg.eval.every_n_versions
    done: list[dict[str, Any]] = []
    if every <= 0:
        return done
    next_version = every
    while not stop_event.wait(1.0):
        try:
            served = _served_version(addresses, cfg.inference.api_key)
        except InferenceError:
            continue  # a server busy or restarting; try again next second
        if served < next_version or served >= cfg.train.steps:
            continue  # the final version is scored by the flow after training
        try:
            result = run_eval(cfg, addresses)
        except InferenceError as e:  # a server died mid-evaluation: score this version again
            get_run_logger().warning("eval at v%d interrupted (%s); retrying", served, e)
            continue
        PrefixSink(metrics, "eval/").log(
            {"accuracy": result.accuracy, "mean_reward": result.mean_reward}, step=result.version
        )
        get_run_logger().info("eval at v%d: accuracy %.3f", result.version, result.accuracy)
        done.append({"version": result.version, "accuracy": result.accuracy})
        next_version = (served // every + 1) * every
    return done
