"""Tasks: score the served policy on held-out prompts, once or every n versions while training runs.

A thin Prefect wrapper over ``rollflow.evaluation`` (which holds the evaluation, reward scoring and
served-version polling).

``evaluate_policy`` waits until every server serves at least ``min_version`` (so "after" really is the
final policy), scores ``eval.n_prompts`` held-out prompts greedily and writes a Prefect table artifact.
Every score is also recorded in the trial's storage as ``eval/v{N}.json`` (``record_eval``: version,
accuracy, mean reward, whether the rewards were binary, the evaluation set's digest, prompts, label),
where ``rollflow ls`` finds a trial's best accuracy without MLflow. N is the checkpoint version scored:
the caller's ``scored_version`` when it knows it (the ``evaluate`` flow serves a fetched checkpoint on a
server that starts at version 0), else the version the servers report. The 'before' record (v0) is
written once and never replaced; a resumed trial's 'before' is that record, not a new evaluation.

Retention (``rollflow.trial.base_split.BaseSplit``): the 'before' evaluation decides which held-out problems
the starting policy solves and stores that split with the trial (``rollflow.trial.base_split``); every later
evaluation of the same set logs ``eval/accuracy_base_solved`` and ``eval/accuracy_base_unsolved``.
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
from rollflow.api.metrics import MetricsSink, PrefixSink
from rollflow.clock.roles import Timeline
from rollflow.evaluation import EvalResult, arun_eval, served_version, wait_for_served_version
from rollflow.trial.base_split import BaseSplit, read_base_split, write_base_split
from rollflow.trial.evaluations import eval_record, write_eval_record
from rollflow.trial.store import open_trial_storage
from tasks.runtime import interrupted, run_sync
from tasks.tracking import table_artifact


def record_eval(
    cfg: ExperimentConfig,
    result: EvalResult,
    label: str,
    *,
    version: int | None = None,
    retention: dict[str, float] | None = None,
) -> None:
    """Write ``eval/v{version}.json`` in the trial's storage (``rollflow.trial.evaluations.write_eval_record``:
    v0, the 'before' score, is never replaced); ``version``: the checkpoint version scored (default: the
    one the servers reported). A score on another evaluation set than the trial's (another split or
    ``eval.n_prompts``: its digest differs from the base split's) is not recorded, so the records of a
    trial stay comparable."""
    import time

    scored = result.version if version is None else int(version)
    doc = {
        "version": scored,
        "accuracy": result.accuracy,
        "mean_reward": result.mean_reward,
        "binary": result.binary,
        "correct_reward": cfg.eval.correct_reward,
        "eval_set": result.eval_set,
        "n": result.n,
        "label": label,
        "at": time.time(),
        **(retention or {}),
    }
    try:
        storage = open_trial_storage(cfg)
        split = read_base_split(storage)
        if split is not None and result.eval_set and split.eval_set != result.eval_set:
            get_run_logger().info(
                "v%d was scored on another evaluation set than the trial's; not recorded in eval/", scored
            )
            return
        if not write_eval_record(storage, doc):
            get_run_logger().info(
                "the 'before' score (v0) is kept; this %s score of v0 is not recorded", label
            )
    except Exception as exc:  # noqa: BLE001 (a record for listings: never the reason an evaluation fails)
        get_run_logger().warning("could not record the evaluation of v%d: %s", scored, exc)


def read_eval_record(cfg: ExperimentConfig, version: int) -> dict[str, Any] | None:
    """The trial's ``eval/v{version}.json``, or None."""
    try:
        return eval_record(open_trial_storage(cfg), version)
    except Exception:  # noqa: BLE001 (storage unreachable: evaluate instead)
        return None


def _base_split(cfg: ExperimentConfig, result: EvalResult, label: str) -> BaseSplit | None:
    """The trial's base split: decided (and stored) by the 'before' evaluation, read back by the others."""
    try:
        storage = open_trial_storage(cfg)
        if label == "before":
            return write_base_split(
                storage, BaseSplit.from_rows(result.rows, result.eval_set, cfg.eval.correct_reward)
            )
        return read_base_split(storage)
    except Exception as exc:  # noqa: BLE001 (retention is a report: never the reason an evaluation fails)
        get_run_logger().warning("base split not available: %s", exc)
        return None


def _log_scores(
    metrics: MetricsSink | None, result: EvalResult, retention: dict[str, float], version: int
) -> None:
    PrefixSink(metrics, "eval/").log(
        {"accuracy": result.accuracy, "mean_reward": result.mean_reward, **retention}, step=version
    )


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
    scored_version: int | None = None,
) -> dict[str, Any]:
    """Score the served policy (module docstring). ``scored_version``: the checkpoint version the servers
    serve, when the caller knows it better than they do (a checkpoint served from a directory)."""
    logger = get_run_logger()
    from rollflow.inference.engines import engine_for

    if label == "before" and (kept := read_eval_record(cfg, 0)) is not None:
        logger.info("eval before: accuracy %.3f, as recorded when the trial started", float(kept["accuracy"]))
        return {**kept, "label": label, "rows": []}
    wait_for_served_version(addresses, cfg.inference.api_key, min_version, engine=engine_for(cfg.inference))
    result = run_eval(cfg, addresses)
    version = result.version if scored_version is None else int(scored_version)
    retention = result.retention(_base_split(cfg, result, label))
    logger.info(
        "eval %s: accuracy %.3f on %d prompts (version %d, %.1fs)%s",
        label,
        result.accuracy,
        result.n,
        version,
        result.seconds,
        "".join(f", {k} {v:.3f}" for k, v in retention.items()),
    )
    _log_scores(metrics, result, retention, version)
    record_eval(cfg, result, label, version=version, retention=retention)
    table_artifact(
        result.rows[:50],
        key=f"eval-{label}".replace("_", "-").lower(),
        description=f"Greedy eval ({label}) of policy v{version}: accuracy {result.accuracy:.3f}",
    )
    return {
        "label": label,
        "accuracy": result.accuracy,
        "mean_reward": result.mean_reward,
        "binary": result.binary,
        "eval_set": result.eval_set,
        "n": result.n,
        "version": version,
        "rows": result.rows,
        **retention,
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
        retention = result.retention(_base_split(cfg, result, "periodic"))
        _log_scores(metrics, result, retention, result.version)
        record_eval(cfg, result, "periodic", retention=retention)
        get_run_logger().log(log_level, "eval at v%d: accuracy %.3f", result.version, result.accuracy)
        done.append({"version": result.version, "accuracy": result.accuracy})
        next_version = (served // every + 1) * every
    from storage.checkpoints import CheckpointStore

    storage = open_trial_storage(cfg)
    if CheckpointStore(storage).is_done() is None:  # stopped before training finished
        return interrupted(done, "evaluation loop stopped before the trainer finished")
    return done
