"""Task: the rollout loop (long-lived): client + checkpoint watcher + executor + shard writer.

It runs until the trainer's done marker appears, ``stop_event`` is set, or a rollout limit is hit, and
returns the loop's summary (accepted/rejected groups, shards written, weight updates seen).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import MetricsSink
from tasks.runtime import run_sync
from tasks.tracking import PrefixSink


@task(name="rollout-loop", cache_policy=NO_CACHE, persist_result=False)
def rollout_loop(
    cfg: ExperimentConfig,
    addresses: list[str],
    *,
    metrics: MetricsSink | None = None,
    stop_event: threading.Event | None = None,
    writer_name: str | None = None,
) -> dict[str, Any]:
    from rollflow.rollout.client import SGLangClient
    from rollflow.rollout.loop import rollout_worker_id, run_rollout_loop
    from rollflow.rollout.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    logger = get_run_logger()
    stop_event = stop_event or threading.Event()
    storage = Storage.open(cfg.storage.root, cfg.experiment, cfg.trial, cfg.storage.options)
    sink = PrefixSink(metrics, "rollout/")
    client = SGLangClient.from_config(cfg.inference, addresses, metrics=sink)
    watcher = CheckpointWatcher.from_config(
        cfg.inference,
        CheckpointStore(storage),
        addresses,
        cache_dir=Path(cfg.storage.local_cache) / cfg.experiment / cfg.trial,
        on_update=client.set_version,
        metrics=sink,
    )
    watcher.start()
    name = writer_name or rollout_worker_id(_flow_run_id())  # unique per flow run, stable across retries

    async def run() -> Any:
        try:
            return await run_rollout_loop(
                cfg,
                storage,
                client,
                version_fn=client.get_version,
                stop_event=stop_event,
                metrics=sink,
                writer_name=name,
            )
        finally:
            await client.aclose()

    try:
        summary = run_sync(run())
        done = CheckpointStore(storage).is_done()
        if done is not None:  # keep loading weights until the servers serve the final policy
            final = int(done.get("final_version", done.get("version", 0)))
            if not watcher.wait_for_version(final, timeout_s=cfg.orchestration.stop_timeout_s * 4):
                logger.warning(
                    "servers did not reach the final version %d; last error: %s", final, watcher.errors[-1:]
                )
    except BaseException:
        stop_event.set()
        raise
    finally:
        watcher.stop()
    logger.info("rollout finished: %s", summary)
    out = dataclasses.asdict(summary) if dataclasses.is_dataclass(summary) else dict(summary)
    out["weight_updates"] = len(getattr(watcher, "events", []))
    return out


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id or None
