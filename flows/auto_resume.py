"""The Prefect side of automatic resume: what an auto-resumed ``async-rl`` run does first, and how a run that
must not be resumed ends.

What it is. The deployments' trigger (``triggers:`` in prefect.yaml and prefect-gpu.yaml) watches their
``async-rl-<trial>`` flow runs; when one ends Crashed (its process was killed: a SIGKILL, an OOM, a lost
node) or Failed, Prefect runs the same deployment with the crashed run's ``config``, ``overrides`` and
``settings`` and ``auto_resume_of=<its name>``. That run:

- ``begin_auto_resume``: takes the trial from the name, names itself ``async-rl-<trial>`` at once (so a
  crash of its own is resumed too) and resumes;
- ``charge_auto_resume``: counts itself against ``orchestration.max_auto_resumes`` per
  ``orchestration.auto_resume_window_s`` in the trial's storage (``rollflow.trial.auto_resume``).

A deployment run whose failure a resume would only repeat (``not_resumable_reason``: a config error, a bad
dataset, a corrupt model, a broken reward function, a spent budget) ends in a Failed state named
``NotResumable`` whose message says why (``not_resumable_state``). The trigger expects ``Failed`` and
``Crashed``, the state names of the events, so such a run is not resumed: nothing restarts forever.

What it is not: the budget or the classification (``rollflow.trial.auto_resume``); a run outside a deployment
(``rollflow run``, a notebook) raises as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prefect import get_run_logger
from prefect.states import Failed, State

from rollflow.api.config import ExperimentConfig
from rollflow.trial.auto_resume import AutoResumeBudget, not_resumable_reason, trial_of_flow_run
from rollflow.trial.store import open_trial_storage
from tasks.runtime import name_flow_run

NOT_RESUMABLE = "NotResumable"  # the Failed state's name: the trigger, which expects "Failed", ignores it

if TYPE_CHECKING:
    from tasks.runtime import RunLogger


def begin_auto_resume(crashed_run: str) -> str:
    """The trial of ``crashed_run`` (``async-rl-<trial>``); names this flow run after it at once."""
    trial = trial_of_flow_run(crashed_run)
    name_flow_run(f"async-rl-{trial}")
    return trial


def charge_auto_resume(cfg: ExperimentConfig, crashed_run: str, logger: RunLogger) -> None:
    """Count this run against the trial's auto-resume budget; ``NotResumableError`` when it is spent."""
    from prefect.runtime import flow_run

    storage = open_trial_storage(cfg)
    o = cfg.orchestration
    budget = AutoResumeBudget(storage, max_resumes=o.max_auto_resumes, window_s=o.auto_resume_window_s)
    n = budget.charge(of=crashed_run, by=str(flow_run.id or ""))
    logger.warning(
        "automatic resume %d of %d (in %.0f s) of trial %s: %s ended Crashed or Failed",
        n,
        o.max_auto_resumes,
        o.auto_resume_window_s,
        cfg.trial,
        crashed_run,
    )


def not_resumable_state(exc: Exception) -> State | None:
    """A ``NotResumable`` Failed state for a deployment run whose failure a resume would repeat, else None
    (the caller re-raises: the run ends Failed, and its deployment's trigger resumes it)."""
    from prefect.runtime import deployment

    reason = not_resumable_reason(exc)
    if reason is None or not deployment.id:
        return None
    get_run_logger().log(logging.ERROR, "not resumable: %s", reason)
    return Failed(name=NOT_RESUMABLE, message=f"not resumable: {reason}")
