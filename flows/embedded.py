"""Embedded mode (one machine): servers, then the rollout, train and eval loops side by side.

What it is: ``run_embedded``, the part of the ``async-rl`` flow that runs a trial's loops in this process:
bootstrap the policy, start the inference servers, score the base policy, run ``rollout-loop``,
``train-loop`` and ``eval-loop`` concurrently as long-lived tasks, and, once the trainer is done, score
the final policy. It returns the run's parts (``before``, ``after``, ``train``, ``rollout``, ``timing``).
What it is not: the trial (``rollflow/trial/``) or distributed mode (``flows/distributed.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from rollflow.api.config import ExperimentConfig
from rollflow.data.preload import preload_libraries
from tasks.bootstrap import bootstrap_model
from tasks.distributed import writer_name_for
from tasks.evaluate import eval_loop, evaluate_policy
from tasks.loops import join_loops
from tasks.progress import RunProgress
from tasks.rollout import rollout_loop
from tasks.servers import start_servers, stop_servers
from tasks.train import train_loop

if TYPE_CHECKING:
    from infra.servers import ServerHandle
    from rollflow.api.metrics import MetricsSink
    from rollflow.clock.roles import Timeline
    from rollflow.timing.report import TimingReporter
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from tasks.runtime import RunLogger


def run_embedded(cfg: ExperimentConfig, tracker: MlflowTracker | None, logger: RunLogger) -> dict[str, Any]:
    """Servers, then the three loops side by side; on any exit the loops stop and the servers go.

    A loop that was interrupted (cancel, SIGTERM, a failure elsewhere) ends its task run Cancelled;
    a failure is re-raised before a cancellation so the cause is what the flow run reports."""
    from rollflow.configuration.layout import describe_layout
    from rollflow.timing.report import bounds

    sink = tracker.sink if tracker else None
    servers = start_servers(cfg, bootstrap_model(cfg))
    logger.info("layout: %s", describe_layout(cfg))
    stop = threading.Event()
    timeline, reporter = _timing(cfg, servers, sink)
    timing: dict[str, Any] = {}
    # one line per 10 % of the run from what every loop logs (tasks/progress.py); the loops' own
    # per-step and per-evaluation lines are DEBUG
    progress = RunProgress(sink, cfg.train.steps, say=logger.info)
    try:
        before = evaluate_policy(cfg, servers.addresses, label="before", min_version=0, metrics=progress)
        preload_libraries()  # before the loops' threads import them concurrently (rollflow/data/preload.py)
        reporter.start()
        done = _run_loops(cfg, servers, progress, stop, timeline)
        train, rollout = done["train-loop"], done["rollout-loop"]
        figures = reporter.stop()
        timing = {"figures": figures, "bounds": bounds(figures), "doc": timeline.document()}
        logger.info("where the time went: %s", timing["bounds"])
        after = evaluate_policy(
            cfg, servers.addresses, label="after", min_version=int(train["final_version"]), metrics=sink
        )
    finally:
        stop.set()
        progress.close()
        reporter.stop()
        stop_servers(servers)
    return {"before": before, "after": after, "train": train, "rollout": rollout, "timing": timing}


def _timing(
    cfg: ExperimentConfig, servers: ServerHandle, sink: MetricsSink | None
) -> tuple[Timeline, TimingReporter]:
    """Where the time goes: every role's states, cores and servers (``rollflow.timing``)."""
    from rollflow.clock.roles import Timeline
    from rollflow.timing.report import TimingReporter

    timeline = Timeline()
    reporter = TimingReporter(
        timeline,
        sink,
        addresses=servers.addresses,
        api_key=cfg.inference.api_key,
        pids={"flow": os.getpid(), **servers.pids()},
    )
    return timeline, reporter


def _run_loops(
    cfg: ExperimentConfig,
    servers: ServerHandle,
    progress: RunProgress,
    stop: threading.Event,
    timeline: Timeline,
) -> dict[str, Any]:
    """The train, rollout and eval loops as concurrent tasks, until the trainer is done (``join_loops``)."""
    train_f = train_loop.submit(
        cfg, metrics=progress, stop_event=stop, pause_addresses=servers.addresses, timeline=timeline,
        report_progress=False,
    )  # fmt: skip
    rollout_f = rollout_loop.submit(
        cfg, servers.addresses, metrics=progress, stop_event=stop, fleet=servers, timeline=timeline,
        writer_name=writer_name_for(0),  # the trial's one worker: a resumed run adopts its open blocks
    )  # fmt: skip
    evals_f = eval_loop.submit(
        cfg, servers.addresses, metrics=progress, stop_event=stop, timeline=timeline, log_level=logging.DEBUG
    )
    return join_loops({"train-loop": train_f, "rollout-loop": rollout_f, "eval-loop": evals_f}, stop)
