"""What a stopped trial kept, and the line that says so: the trial, its resume point, the command to resume.

What it is:
- ``trial_for_command``: the trial a command will run, named before the flow starts (a fresh
  ``{config trial}-{date}-{time}-{hex}`` when none is named), so that the line below can name it;
- ``kept_line``: the line ``rollflow run/resume`` prints after Ctrl-C, e.g.::

    rollflow: stopped by Ctrl-C; kept trial demo-20261125-004512-3f2a (resume point at version 6;
    checkpoints up to v7). Resume it with: rollflow resume demo-20261125-004512-3f2a --config configs/tiny_cpu.yaml

  and ``rlrun_kept_line``, what ``RLRun.train()`` prints before it re-raises the ``KeyboardInterrupt``:
  the command that resumes the trial from the project directory, and the Python call.
What it is not: the stop itself, nor the console (``flows/cli/interrupt.py`` keeps Prefect's lines off it);
it only reads storage.
"""

from __future__ import annotations

import shlex

from rollflow.api.config import ExperimentConfig
from rollflow.trial.store import open_trial_storage


def trial_for_command(config: str | None, overrides: list[str], trial: str | None) -> str:
    """The trial this command runs: ``trial``, else a ``trial=`` override, else a fresh name."""
    from rollflow.configuration.loader import load_config
    from rollflow.trial.naming import expand_trial_name, trial_to_run

    if trial is not None:
        return expand_trial_name(trial)
    return trial_to_run(load_config(config, overrides), overrides, None)[0]


def resume_command(trial: str, config: str | None, overrides: list[str]) -> str:
    """``rollflow resume TRIAL --config C [overrides]``; the ``trial=`` override is the positional."""
    rest = [o for o in overrides if o.split("=", 1)[0].strip() != "trial"]
    words = ["rollflow", "resume", trial, *(["--config", config] if config else []), *rest]
    return " ".join(shlex.quote(w) for w in words)


def _kept(cfg: ExperimentConfig, trial: str) -> str:
    """What storage holds of ``trial``: its newest resume point and checkpoint, or that it holds nothing
    (or, when storage cannot be read, that it could not say: the line must come out anyway)."""
    from rollflow.training.resume import list_resume_steps
    from storage.checkpoints import CheckpointStore

    try:
        storage = open_trial_storage(cfg, trial)
        steps = list_resume_steps(storage)
        latest = CheckpointStore(storage).latest_version()
    except Exception as e:  # noqa: BLE001
        return f"could not read what was kept: {type(e).__name__}"
    point = f"resume point at version {steps[-1]}" if steps else "no resume point yet: training restarts at 0"
    return point + (f"; checkpoints up to v{latest}" if latest is not None else "")


def kept_line(trial: str, config: str | None, overrides: list[str], *, shown: list[str]) -> str:
    """The one line printed after Ctrl-C (module docstring). ``overrides`` open the trial's storage;
    the resume command shows only ``shown`` (the public ones: a credential never goes to the console)."""
    from rollflow.configuration.loader import load_config

    try:
        kept = _kept(load_config(config, [*overrides, f"trial={trial}"]), trial)
    except Exception as e:  # noqa: BLE001 (a config that no longer loads: the line still comes out)
        kept = f"could not read what was kept: {type(e).__name__}"
    return (
        f"rollflow: stopped by Ctrl-C; kept trial {trial} ({kept}). "
        f"Resume it with: {resume_command(trial, config, shown)}"
    )


def rlrun_kept_line(cfg: ExperimentConfig, trial: str) -> str:
    """The line ``RLRun.train()`` prints after Ctrl-C: the same, with the command that resumes it from
    the project directory (the recorded config does the rest; only a storage root other than the
    default's is named) and the Python call that does the same."""
    from rollflow.configuration.project_dir import project_dir

    located = [f"experiment={cfg.experiment}"]
    if cfg.storage.root != ExperimentConfig().storage.root:
        located.append(f"storage.root={cfg.storage.root}")
    command = " ".join(shlex.quote(w) for w in ["rollflow", "resume", trial, *located])
    return (
        f"rollflow: stopped by Ctrl-C; kept trial {trial} ({_kept(cfg, trial)}). "
        f"Resume it with: {command} (in {project_dir()}), or in Python: "
        f"RLRun(..., trial={trial!r}).train(resume=True)"
    )
