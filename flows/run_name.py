"""The name an ``async-rl`` flow run carries from its first log line: ``async-rl-<trial>``.

What it is: ``async_rl_run_name``, the flow's ``flow_run_name`` callable. Prefect calls it as the run
starts, before "Beginning flow run ..." (a direct call, ``rollflow run``, a deployment run taken by a
worker alike), so the run is never known by a random name such as ``overjoyed-chicken`` that is renamed
later. It works out the trial from the run's parameters as the flow does:

- ``trial`` given: that name, ``{date}`` expanded (``rollflow.trial.naming``);
- ``auto_resume_of`` given: the trial of the run it resumes (``rollflow.trial.auto_resume``);
- a ``trial=`` override: the config's trial, expanded;
- none (a new trial; not a resume): a fresh name ``{config trial}-{YYYYmmdd-HHMMSS}-{4 hex}``, which the
  flow then takes as its trial (``planned_trial``), so the name and the trial are the same.

A run whose parameters name no trial it can work out (a config that does not load, ``resume`` without a
trial) is called ``async-rl``; the flow then fails with the error that says what is wrong.

``evaluate_run_name`` does the same for the ``evaluate`` flow: ``evaluate-<trial>-v<N>``, the trial of
its config and overrides, N its ``version`` parameter or, for -1 (the latest), the version
``checkpoints/LATEST`` names (one small read); ``evaluate-<trial>`` when nothing is published yet, and
``evaluate`` when the config does not load. The flow renames the run if the version it resolves differs
(a damaged LATEST).
What it is not: the choice of the trial's state (new, unfinished, trained, finished: ``rollflow.trial.choice``).
"""

from __future__ import annotations

from typing import Any

FLOW_NAME = "async-rl"
_planned: dict[str, str] = {}  # flow run id -> the fresh trial its name announced (taken by the flow)


def _trial_of(params: dict[str, Any]) -> tuple[str, bool]:
    """(trial, fresh) for a run's parameters; raises when they name none."""
    from rollflow.configuration.loader import load_config
    from rollflow.trial.naming import expand_trial_name, trial_to_run
    from tasks.runtime import config_data

    if params.get("auto_resume_of"):
        from rollflow.trial.auto_resume import trial_of_flow_run

        return trial_of_flow_run(str(params["auto_resume_of"])), False
    if params.get("trial") is not None:
        return expand_trial_name(str(params["trial"])), False
    overrides = list(params.get("overrides") or [])
    data = config_data(params.get("settings"))
    cfg = load_config(None if data is not None else params.get("config"), overrides, data=data)
    trial, fresh = trial_to_run(cfg, overrides, None)
    if fresh and params.get("resume"):
        raise ValueError("resume without a trial")
    return trial, fresh


def async_rl_run_name() -> str:
    """``async-rl-<trial>`` for the flow run being started (module docstring); ``async-rl`` when its
    parameters name no trial."""
    from prefect.runtime import flow_run

    try:
        trial, fresh = _trial_of(dict(flow_run.parameters or {}))
    except Exception:  # noqa: BLE001 (the flow body reports a bad config or parameter with its own error)
        return FLOW_NAME
    if fresh and flow_run.id:
        _planned[str(flow_run.id)] = trial
    return f"{FLOW_NAME}-{trial}"


def evaluate_run_name() -> str:
    """``evaluate-<trial>-v<N>`` for the evaluate flow run being started (module docstring)."""
    from prefect.runtime import flow_run

    params = dict(flow_run.parameters or {})
    try:
        from rollflow.configuration.loader import load_config
        from rollflow.trial.store import open_trial_storage
        from storage.checkpoints import CheckpointStore
        from tasks.runtime import config_data

        data = config_data(params.get("settings"))
        cfg = load_config(
            None if data is not None else params.get("config"), params.get("overrides") or [], data=data
        )
        version = int(params.get("version", -1))
        if version < 0:
            latest = CheckpointStore(open_trial_storage(cfg)).latest_version()
            version = -1 if latest is None else latest
    except Exception:  # noqa: BLE001 (the flow body reports a bad config or parameter with its own error)
        return "evaluate"
    return f"evaluate-{cfg.trial}" + (f"-v{version}" if version >= 0 else "")


def planned_trial() -> str | None:
    """The fresh trial the current flow run was named after, if its name announced one (taken once)."""
    from prefect.runtime import flow_run

    return _planned.pop(str(flow_run.id), None) if flow_run.id else None
