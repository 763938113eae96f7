"""Task: the train loop (long-lived). Builds storage + Trainer from config and runs it to the end.

For the synchronous baseline (rollout.pause_during_training) it pauses the inference servers while a
step runs (``infra.control.PauseServersHooks``). Run on its own (a ``train`` deployment run) it reports
progress itself (``tasks/progress.py``); the embedded flow reports it for all its loops and says so with
``report_progress=False``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink, PrefixSink
from rollflow.clock.roles import Timeline
from rollflow.trial.store import open_trial_storage
from tasks.progress import RunProgress
from tasks.runtime import interrupted


@task(name="train-loop", cache_policy=NO_CACHE, persist_result=False)
def train_loop(
    cfg: ExperimentConfig,
    *,
    metrics: MetricsSink | None = None,
    stop_event: threading.Event | None = None,
    pause_addresses: list[str] | None = None,
    timeline: Timeline | None = None,
    report_progress: bool = True,
) -> dict[str, Any]:
    from rollflow.training.warm_start_reuse import trainer_class

    Trainer = trainer_class(cfg)  # noqa: N806  # the plain Trainer unless train.warm_start_from is set
    logger = get_run_logger()
    stop_event = stop_event or threading.Event()
    storage = open_trial_storage(cfg)
    hooks = None
    if cfg.rollout.pause_during_training and pause_addresses:
        from infra.control import PauseServersHooks
        from rollflow.inference.engines import engine_for

        hooks = PauseServersHooks(pause_addresses, cfg.inference.api_key, engine_for(cfg.inference))
    progress = RunProgress(metrics, cfg.train.steps, say=logger.info) if report_progress else None
    sink = PrefixSink(progress if progress is not None else metrics, "train/")
    own_timeline = timeline is None  # a deployment run (distributed mode): this process's own accounting
    timeline = timeline if timeline is not None else Timeline()
    trainer = Trainer(cfg, storage, metrics=sink, stop_event=stop_event, hooks=hooks, timeline=timeline)
    try:
        summary = trainer.run()
    finally:
        stop_event.set()  # whatever happened, the other loops must not wait for more versions
        if progress is not None:
            progress.close()
    if own_timeline and metrics is not None:
        metrics.log(timeline.metrics(), step=trainer.version)
    out = dataclasses.asdict(summary) if dataclasses.is_dataclass(summary) else dict(summary)
    if out.get("stopped") and not out.get("done"):
        logger.warning("training interrupted at version %s", out.get("final_version"))
        return interrupted(out, f"training stopped at version {out.get('final_version')} before train.steps")
    return out  # the trainer said "training finished: ..." (a core line, in this run's logs too)
