"""Tasks: score the served policy on held-out prompts, once or every n versions while training runs.

A thin Prefect wrapper over ``rollflow.evaluation`` (which holds the evaluation, reward scoring and
served-version polling).

``evaluate_policy`` waits until every server serves at least ``min_version`` (so "after" really is the
final policy), scores ``eval.n_prompts`` held-out prompts greedily and writes a Prefect table artifact.
Every score is also recorded in the trial's storage as ``eval/v{N}.json`` (``record_eval``: version,
accuracy, prompts, label), where ``rollflow ls`` finds a trial's best accuracy without MLflow.
``eval_loop`` repeats that every ``eval.every_n_versions`` published versions until stopped; it logs
each score at ``log_level`` (the embedded flow passes DEBUG: its progress lines carry the newest score).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import InferenceError
from rollflow.api.metrics import MetricsSink
from rollflow.configuration.trial_storage import open_trial_storage
from rollflow.evaluation import EvalResult, arun_eval, served_version, wait_for_served_version
from rollflow.timing.clock import Timeline
from rollflow.tracking.prefix_sink import PrefixSink
from tasks.runtime import interrupted, run_sync
from tasks.tracking import table_artifact


def record_eval(cfg: ExperimentConfig, result: EvalResult, label: str) -> None:
    """Write ``eval/v{version}.json`` in the trial's storage (a rerun of a version replaces it)."""
    import time

    from storage import keys

    doc = {
        "version": result.version,
        "accuracy": result.accuracy,
        "mean_reward": result.mean_reward,
        "n": result.n,
        "label": label,
        "at": time.time(),
    }
    try:
        storage = open_trial_storage(cfg)
        storage.put_json(keys.eval_key(result.version), doc)
    except Exception as exc:  # noqa: BLE001 (a record for listings: never the reason an evaluation fails)
        get_run_logger().warning("could not record the evaluation of v%d: %s", result.version, exc)


def run_eval(cfg: ExperimentConfig, addresses: list[str]) -> EvalResult:
    """Core call (no Prefect): ``rollflow.evaluation.arun_eval`` from synchronous code."""
    return run_sync(arun_eval(cfg, addresses))


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
    from rollflow.inference.engines import engine_for

    wait_for_served_version(addresses, cfg.inference.api_key, min_version, engine=engine_for(cfg.inference))
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
    record_eval(cfg, result, label)
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
    timeline: Timeline | None = None,
    log_level: int = logging.INFO,
) -> list[dict[str, Any]]:
    """Evaluate every ``eval.every_n_versions`` served versions until ``stop_event`` is set."""
    from rollflow.inference.engines import engine_for

    every = cfg.eval.every_n_versions
    clock = (timeline if timeline is not None else Timeline()).role("eval", initial="idle")
    done: list[dict[str, Any]] = []
    if every <= 0:
        return done
    next_version = every
    while not stop_event.wait(1.0):
        try:
            served = served_version(addresses, cfg.inference.api_key, engine=engine_for(cfg.inference))
        except InferenceError:
            continue  # a server busy or restarting; try again next second
        if served < next_version or served >= cfg.train.steps:
            continue  # the final version is scored by the flow after training
        try:
            with clock.during("evaluating"):
                result = run_eval(cfg, addresses)
        except InferenceError as e:  # a server died mid-evaluation: score this version again
            get_run_logger().warning("eval at v%d interrupted (%s); retrying", served, e)
            continue
        PrefixSink(metrics, "eval/").log(
            {"accuracy": result.accuracy, "mean_reward": result.mean_reward}, step=result.version
        )
        record_eval(cfg, result, "periodic")
        get_run_logger().log(log_level, "eval at v%d: accuracy %.3f", result.version, result.accuracy)
        done.append({"version": result.version, "accuracy": result.accuracy})
        next_version = (served // every + 1) * every
    from storage.checkpoints import CheckpointStore

    storage = open_trial_storage(cfg)
    if CheckpointStore(storage).is_done() is None:  # stopped before training finished
        return interrupted(done, "evaluation loop stopped before the trainer finished")
    return done
