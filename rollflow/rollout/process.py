"""One rollout process: the client, the checkpoint watcher and the fleet link around the rollout loop.

What it is: ``run_rollout_process`` builds what the rollout loop (``rollflow.rollout.loop``) needs in this
process, runs it until the trainer's done marker appears, ``stop_event`` is set or a rollout limit is hit,
and returns the loop's summary as a dict (accepted/rejected groups, shards written, weight updates seen,
server restarts):

- the ``EngineClient`` over the servers' addresses and the ``CheckpointWatcher`` that loads each new
  checkpoint into them (its version goes to the client);
- with ``supervisor`` (the launched servers' supervisor), its events reach the client and the watcher
  (``rollflow.inference.fleet_link.FleetLink``): a dead server is routed around, a restarted one is
  caught up to the served version, a lost one is dropped. When no server is left (or none answered for
  ``inference.dead_server_timeout_s``) the loop stops, ``stop_event`` is set (the trainer stops after its
  step and writes its resume point), and a ``ServerLostError`` says which servers died and why;
- a resumed trial's servers are caught up to the newest committed version before generating, and after
  the trainer's done marker the watcher keeps loading until they serve the final policy.

What it is not: Prefect (the ``rollout-loop`` task, ``tasks/rollout.py``, calls this and names the
worker) or the loop itself.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ServerLostError
from rollflow.api.metrics import MetricsSink, PrefixSink
from rollflow.clock.roles import Timeline

if TYPE_CHECKING:
    from rollflow.inference.client import EngineClient
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

log = logging.getLogger(__name__)


def run_rollout_process(
    cfg: ExperimentConfig,
    storage: Storage,
    addresses: list[str],
    *,
    writer_name: str,
    stop_event: threading.Event,
    run_sync: Callable[[Coroutine[Any, Any, Any]], Any],
    metrics: MetricsSink | None = None,
    supervisor: Any = None,
    timeline: Timeline | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> tuple[dict[str, Any], bool]:
    """Run this process's rollout (module docstring): (its summary, whether the trainer finished).
    ``run_sync`` runs the loop's coroutine to its end; ``logger`` gets the lines (the task's run logger)."""
    from rollflow.inference.client import EngineClient
    from rollflow.inference.fleet_link import FleetLink
    from rollflow.rollout.loop import run_rollout_loop
    from storage.checkpoints import CheckpointStore

    store = CheckpointStore(storage)
    sink = PrefixSink(metrics, "rollout/")
    client = EngineClient.from_config(cfg.inference, addresses, metrics=sink)
    fatal: list[str] = []
    own_timeline = timeline is None  # a deployment run (distributed mode): this process's own accounting
    timeline = timeline if timeline is not None else Timeline()

    def on_fatal(message: str) -> None:
        fatal.append(message)
        stop_event.set()

    watcher = _watcher(cfg, store, addresses, client, sink, on_fatal, timeline)
    link = FleetLink(client, watcher)
    if supervisor is not None:
        supervisor.add_listener(link)
    watcher.start()
    _catch_up(cfg, store, watcher, logger.warning)

    async def run() -> Any:
        try:
            return await run_rollout_loop(
                cfg, storage, client, version_fn=client.get_version, stop_event=stop_event, metrics=sink,
                writer_name=writer_name, timeline=timeline,
            )  # fmt: skip
        finally:
            await client.aclose()

    try:
        summary = run_sync(run())
        done = _serve_final(cfg, store, watcher, logger)
    except BaseException:
        stop_event.set()
        raise
    finally:
        watcher.stop()
        if supervisor is not None:
            supervisor.remove_listener(link)
    if own_timeline and metrics is not None:
        metrics.log(timeline.metrics(), step=timeline.version)
    if fatal:
        raise ServerLostError(f"rollout stopped: {fatal[0]}")
    logger.info("rollout finished: %s", summary.brief())
    return _report(summary, watcher, supervisor), done is not None


def _watcher(
    cfg: ExperimentConfig,
    store: CheckpointStore,
    addresses: list[str],
    client: EngineClient,
    sink: MetricsSink,
    on_fatal: Callable[[str], None],
    timeline: Timeline,
) -> CheckpointWatcher:
    """The watcher that loads each new checkpoint into this process's servers and tells the client."""
    from rollflow.inference.watcher import CheckpointWatcher

    return CheckpointWatcher.from_config(
        cfg.inference,
        store,
        addresses,
        cache_dir=Path(cfg.storage.local_cache) / cfg.experiment / cfg.trial,
        on_update=client.set_version,
        metrics=sink,
        ack_ttl_s=cfg.storage.ack_ttl_s,
        on_fatal=on_fatal,
        clock=timeline.role("weights", initial="waiting"),
    )


def _serve_final(
    cfg: ExperimentConfig,
    store: CheckpointStore,
    watcher: CheckpointWatcher,
    logger: logging.Logger | logging.LoggerAdapter[Any],
) -> dict[str, Any] | None:
    """The trainer's done marker, if it is there; then keep loading until the servers serve the final policy."""
    done = store.is_done()
    if done is not None:
        final = int(done.get("final_version", done.get("version", 0)))
        if not watcher.wait_for_version(final, timeout_s=cfg.orchestration.stop_timeout_s * 4):
            logger.warning(
                "servers did not reach the final version %d; last error: %s", final, watcher.errors[-1:]
            )
    return done


def _report(summary: Any, watcher: CheckpointWatcher, supervisor: Any) -> dict[str, Any]:
    """The loop's summary as a dict, with the weight updates seen and the servers restarted or lost."""
    out = dataclasses.asdict(summary) if dataclasses.is_dataclass(summary) else dict(summary)
    out["weight_updates"] = len(watcher.events)
    if supervisor is not None:
        out["server_restarts"] = sum(supervisor.restarts.values())
        out["servers_lost"] = len(supervisor.lost)
    return out


def _catch_up(
    cfg: ExperimentConfig, store: CheckpointStore, watcher: CheckpointWatcher, warn: Callable[..., None]
) -> None:
    """A resumed trial's servers start on the base weights (version 0): wait until they serve the newest
    committed version before generating, so nothing (a continued partial episode above all) is generated
    by a policy the staleness bound would reject anyway. A fresh trial (no version past 0) waits for nothing."""
    latest = store.latest_version()
    if not latest:
        return
    if not watcher.wait_for_version(latest, timeout_s=cfg.inference.startup_timeout_s):
        warn(
            "servers did not reach v%d within %.0f s before the rollout started; generating anyway (the "
            "staleness bound judges what they make); last error: %s",
            latest,
            cfg.inference.startup_timeout_s,
            watcher.errors[-1:],
        )
