"""Task: the rollout loop (long-lived): client + checkpoint watcher + executor + shard writer.

It runs until the trainer's done marker appears, ``stop_event`` is set, or a rollout limit is hit, and
returns the loop's summary (accepted/rejected groups, shards written, weight updates seen); the work is
``rollflow.rollout.process.run_rollout_process``. With ``fleet`` (the launched servers' ``ServerGroup``),
its supervisor's events reach the client and the watcher. A rollout stopped from outside before the
trainer finished ends Cancelled.
"""

from __future__ import annotations

import threading
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.servers import ServerHandle
from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink
from rollflow.clock.roles import Timeline
from rollflow.trial.store import open_trial_storage
from tasks.runtime import interrupted, run_sync


@task(name="rollout-loop", cache_policy=NO_CACHE, persist_result=False)
def rollout_loop(
    cfg: ExperimentConfig,
    addresses: list[str],
    *,
    metrics: MetricsSink | None = None,
    stop_event: threading.Event | None = None,
    writer_name: str | None = None,
    fleet: ServerHandle | None = None,
    timeline: Timeline | None = None,
) -> dict[str, Any]:
    from rollflow.rollout.loop import rollout_worker_id
    from rollflow.rollout.process import run_rollout_process

    stop_event = stop_event or threading.Event()
    supervisor = fleet.supervisor if fleet is not None else None
    out, finished = run_rollout_process(
        cfg,
        open_trial_storage(cfg),
        addresses,
        writer_name=writer_name
        or rollout_worker_id(_flow_run_id()),  # unique per flow run, stable across retries
        stop_event=stop_event,
        run_sync=run_sync,
        metrics=metrics,
        supervisor=supervisor,
        timeline=timeline,
        logger=get_run_logger(),
    )
    if not finished and stop_event.is_set():  # stopped from outside before the trainer finished
        return interrupted(out, "rollout stopped before the trainer finished")
    return out


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id or None
