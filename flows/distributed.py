"""Distributed async-rl: the parent flow's part when rollout and training are separate deployment runs.

The story, as in embedded mode but with the loops on other machines:

1. bootstrap the policy and start one inference server of this flow's own (for evaluation only: one
   server of ``tp_size`` GPUs, whatever ``inference.n_servers`` the rollout workers run; ``eval_config``),
   with a checkpoint watcher that keeps it on the newest published version; score the base policy;
2. trigger one ``train`` and ``orchestration.n_rollout_workers`` ``rollout`` deployment runs
   (``tasks/distributed.py``), all on one storage root and one MLflow run: the trainer logs into it,
   rollout worker ``i`` into a nested run ``rollout-{i}``;
3. evaluate every ``eval.every_n_versions`` published versions while they run, and wait for them with
   Prefect's ``wait_for_flow_run``;
4. score the final policy; the caller (``flows/async_rl.py``) registers it and writes the summary.

Cancelling the parent cancels the children: they are subflows (``as_subflow=True``), and Prefect's server
moves the non-final subflow runs of a cancelled flow run to Cancelling.

What it is not: the child flows (``flows/rollout.py``, ``flows/train.py``) or a scheduler.
Run it: ``prefect deployment run 'async-rl/gpu'`` (see prefect.yaml), or
``python -m flows.async_rl orchestration.mode=distributed`` with the deployments and workers up.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollflow.api.config import ExperimentConfig
from rollflow.trial.store import open_trial_storage
from tasks.bootstrap import bootstrap_model
from tasks.distributed import TRAIN, trigger_children, wait_children
from tasks.evaluate import eval_loop, evaluate_policy
from tasks.servers import start_servers, stop_servers

if TYPE_CHECKING:
    from rollflow.inference.watcher import CheckpointWatcher
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from storage.checkpoints import CheckpointStore


def eval_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config of the parent's evaluation servers: one server (``inference.n_servers`` sizes each
    rollout worker's fleet, not the evaluator's). An ``external`` backend keeps its addresses."""
    if cfg.inference.backend == "external" or cfg.inference.n_servers == 1:
        return cfg
    return dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, n_servers=1))


def run_distributed(
    cfg: ExperimentConfig, parameters: dict[str, Any], tracker: MlflowTracker | None
) -> dict[str, Any]:
    """Steps 1-4 above; returns ``{"before", "after", "train", "rollout"}`` like embedded mode.

    ``parameters``: what every child flow gets (``config`` and ``overrides``).
    """
    from storage.checkpoints import CheckpointStore

    sink = tracker.sink if tracker else None
    store = CheckpointStore(open_trial_storage(cfg))
    model_path = bootstrap_model(cfg)  # before the children start: they find it built
    servers = start_servers(eval_config(cfg), model_path)
    watcher = _eval_watcher(cfg, store, servers.addresses)
    stop = threading.Event()
    try:
        before = evaluate_policy(cfg, servers.addresses, label="before", min_version=0, metrics=sink)
        watcher.start()
        runs = trigger_children(cfg, parameters, tracker.run_id if tracker else None)
        evals_f = eval_loop.submit(cfg, servers.addresses, metrics=sink, stop_event=stop)
        try:
            states = wait_children(cfg, runs)
        finally:
            stop.set()
        evals_f.result()
        done = store.is_done() or {}
        final = int(done.get("version", 0))
        after = evaluate_policy(cfg, servers.addresses, label="after", min_version=final, metrics=sink)
    finally:
        stop.set()
        watcher.stop()
        stop_servers(servers)
    return {"before": before, "after": after, **_children_parts(cfg, before, done, final, runs, states)}


def _eval_watcher(cfg: ExperimentConfig, store: CheckpointStore, addresses: list[str]) -> CheckpointWatcher:
    """The watcher that loads each published checkpoint into the parent's evaluation servers."""
    from rollflow.inference.watcher import CheckpointWatcher

    return CheckpointWatcher.from_config(
        cfg.inference,
        store,
        addresses,
        cache_dir=Path(cfg.storage.local_cache) / cfg.experiment / cfg.trial / "eval",
        ack_ttl_s=cfg.storage.ack_ttl_s,
    )


def _children_parts(
    cfg: ExperimentConfig,
    before: dict[str, Any],
    done: dict[str, Any],
    final: int,
    runs: dict[str, str],
    states: dict[str, Any],
) -> dict[str, Any]:
    """``train`` and ``rollout`` as embedded mode reports them, from the child runs' end states.

    The trainer ran in another process: what this run trained is the versions it moved past "before"
    (one version per step), which is what the registry gate asks for. ``final``: the done marker's version."""
    train = {
        **done,
        "final_version": final,
        "steps_run": max(0, final - int(before.get("version", 0))),
        "flow_run_id": runs[TRAIN],
        "state": states[TRAIN],
    }
    rollout = {
        "workers": cfg.orchestration.n_rollout_workers,
        "completed": sum(1 for n, s in states.items() if n != TRAIN and s == "Completed"),
        "flow_runs": {n: fid for n, fid in runs.items() if n != TRAIN},
    }
    return {"train": train, "rollout": rollout}
