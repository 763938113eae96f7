"""Tasks of distributed mode: trigger the child deployment runs, wait for them, track them in MLflow.

What it is:

- ``trigger_children``: one ``train`` deployment run and ``orchestration.n_rollout_workers`` ``rollout``
  deployment runs, created with ``run_deployment(..., timeout=0, as_subflow=True)``. As subflows they
  hang under the parent in the UI, and Prefect's server cancels them when the parent is cancelled.
  Rollout worker ``i`` gets ``worker_index=i`` (its writer id); every child gets the parent's MLflow
  run id.
- ``wait_children``: waits with ``prefect.flow_runs.wait_for_flow_run`` (server events, no polling).
  When the train run ends the rollout runs stop by themselves (they see the trainer's done marker);
  if it did not complete, they are cancelled. A rollout run that fails while the trainer goes on is
  logged and the others carry on (the shared staleness bound and prompt claims re-issue its work);
  when every rollout run has ended and the trainer has not, the train run is cancelled. A child that
  did not complete becomes a ``LoopFailedError`` naming it (``train-loop`` or ``rollout-loop``).
- ``child_tracker``: what a child flow logs to: the trainer into the parent's run (its metrics are the
  trial's, as in embedded mode), a rollout worker into a run nested under it (``rollout-{i}``).

What it is not: the parent flow's story (``flows/distributed.py``) or the loops themselves.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import LoopFailedError

TRAIN = "train-loop"

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

    from rollflow.tracking.mlflow_tracker import MlflowTracker


def rollout_name(index: int) -> str:
    return f"rollout-{index}"


def writer_name_for(worker_index: int) -> str:
    """The writer id of rollout worker ``worker_index``: stable, so a restarted worker finds its state."""
    return f"rollout-w{worker_index}"


@task(name="trigger-children", cache_policy=NO_CACHE, persist_result=False)
def trigger_children(
    cfg: ExperimentConfig, parameters: dict[str, Any], mlflow_parent_run_id: str | None
) -> dict[str, Any]:
    """Create the child flow runs (not waiting); returns their ids, ``{"train-loop": id, "rollout-0": id}``."""
    from prefect.deployments import run_deployment

    orch = cfg.orchestration
    common = {**parameters, "mlflow_parent_run_id": mlflow_parent_run_id}
    runs = {
        TRAIN: run_deployment(
            orch.train_deployment,
            parameters=common,
            timeout=0,
            as_subflow=True,
            flow_run_name=f"train-{cfg.trial}",
        )
    }
    for i in range(orch.n_rollout_workers):
        runs[rollout_name(i)] = run_deployment(
            orch.rollout_deployment,
            parameters={**common, "worker_index": i},
            timeout=0,
            as_subflow=True,
            flow_run_name=f"rollout-{cfg.trial}-w{i}",  # the name the rollout flow gives itself
        )
    ids = {name: str(fr.id) for name, fr in runs.items()}
    get_run_logger().info("triggered %s", ids)
    return ids


@task(name="wait-children", cache_policy=NO_CACHE, persist_result=False)
def wait_children(cfg: ExperimentConfig, runs: dict[str, str]) -> dict[str, str]:
    """Wait for every child run (see the module docstring); returns the final state name of each."""
    from tasks.runtime import run_sync

    return run_sync(_await_children(cfg, runs))


async def _await_children(cfg: ExperimentConfig, runs: dict[str, str]) -> dict[str, str]:
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.flow_runs import wait_for_flow_run

    logger = get_run_logger()
    timeout = cfg.orchestration.deployment_timeout_s
    states: dict[str, Any] = {}
    async with get_client() as client:
        waits = {
            asyncio.create_task(
                wait_for_flow_run(UUID(fid), timeout=None if timeout is None else int(timeout), client=client)
            ): name
            for name, fid in runs.items()
        }
        cancelled: set[str] = set()
        try:
            while waits:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    name = waits.pop(t)
                    state = t.result().state
                    states[name] = state
                    logger.info("%s ended: %s %s", name, state.name, state.message or "")
                    if name == TRAIN and not state.is_completed():
                        rest = [n for n in runs if n not in states]
                        cancelled |= await _cancel(client, runs, rest, "the train run did not complete")
                    elif name != TRAIN and not state.is_completed() and TRAIN not in states:
                        logger.error("rollout worker %s ended %s; the others go on", name, state.name)
                if (
                    TRAIN not in states
                    and TRAIN not in cancelled
                    and all(n in states for n in runs if n != TRAIN)
                ):
                    logger.error("every rollout worker has ended and the trainer has not: cancelling it")
                    cancelled |= await _cancel(client, runs, [TRAIN], "every rollout worker ended")
        finally:
            for t in waits:  # the parent itself is being cancelled or timed out
                t.cancel()
    details = "; ".join(f"{n} {runs[n]}: {s.name} ({s.message or 'no message'})" for n, s in states.items())
    if not states[TRAIN].is_completed():
        cause = "rollout-loop" if TRAIN in cancelled else TRAIN
        raise LoopFailedError(cause, f"the distributed run did not complete. Child flow runs: {details}")
    for n, st in states.items():
        if not st.is_completed():
            logger.warning("%s ended %s, but the trainer completed: %s", n, st.name, st.message or "")
    return {n: s.name for n, s in states.items()}


async def _cancel(client: PrefectClient, runs: dict[str, str], names: list[str], why: str) -> set[str]:
    from uuid import UUID

    from prefect.states import Cancelling

    for n in names:
        await client.set_flow_run_state(UUID(runs[n]), Cancelling(message=why), force=True)
    return set(names)


def child_tracker(cfg: ExperimentConfig, mlflow_parent_run_id: str | None, role: str) -> MlflowTracker | None:
    """An ``MlflowTracker`` for a child flow (``None`` without a parent run or with tracking off): the
    trainer (``role="train"``) logs into the parent's run, a rollout worker into a nested run."""
    if not mlflow_parent_run_id or not cfg.tracking.enabled:
        return None
    from rollflow.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(cfg)
    if role == "train":
        tracker.attach(mlflow_parent_run_id)
    else:
        tracker.start_nested(mlflow_parent_run_id, role)
    return tracker
