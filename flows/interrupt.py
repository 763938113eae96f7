"""What a command-line run (``rollflow run/resume``, ``python -m flows.async_rl``) says when Ctrl-C stops it.

What it is:
- ``trial_for_command``: the trial a command will run, named before the flow starts (a fresh
  ``{config trial}-{date}-{time}-{hex}`` when none is named), so that the line below can name it;
- ``quiet_interrupt_logs``: while a run is stopped by Ctrl-C, Prefect logs the ``KeyboardInterrupt`` it
  re-raises ("Engine execution interrupted by base exception", with the traceback) and its crash lines;
  this keeps them off the console (they still reach the Prefect API), so the user reads one line;
- ``kept_line``: that one line, e.g.::

    rollflow: stopped by Ctrl-C; kept trial demo-20261125-004512-3f2a (resume point at version 6;
    checkpoints up to v7). Resume it with: rollflow resume demo-20261125-004512-3f2a --config configs/tiny_cpu.yaml

  and ``rlrun_kept_line``, what ``RLRun.train()`` prints before it re-raises the ``KeyboardInterrupt``:
  the command that resumes the trial from the project directory, and the Python call.

The exit status is ``INTERRUPTED_STATUS`` (130 = 128 + SIGINT, the shell's convention).
What it is not: the stop itself: the flow stops its loops, the trainer writes its resume point and
the servers go (flows/async_rl.py); nothing here touches storage except to read what was kept.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Iterator

from rollflow.api.config import ExperimentConfig
from rollflow.configuration.trial_storage import open_trial_storage

INTERRUPTED_STATUS = 130


def trial_for_command(config: str | None, overrides: list[str], trial: str | None) -> str:
    """The trial this command runs: ``trial``, else a ``trial=`` override, else a fresh name."""
    from rollflow.configuration.loader import load_config
    from rollflow.trials import expand_trial_name, fresh_trial_name, named_in_overrides

    if trial is not None:
        return expand_trial_name(trial)
    cfg = load_config(config, overrides)
    return expand_trial_name(cfg.trial) if named_in_overrides(overrides) else fresh_trial_name(cfg.trial)


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


class _NoInterruptOnConsole(logging.Filter):
    """Drop console records about a ``KeyboardInterrupt`` (its traceback and Prefect's crash lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt) and "KeyboardInterrupt" not in record.getMessage()


@contextlib.contextmanager
def quiet_interrupt_logs() -> Iterator[None]:
    """Keep Ctrl-C's tracebacks and crash lines off the console handlers while the block runs."""
    quiet = _NoInterruptOnConsole()
    handlers = {
        h
        for name in ("", "prefect")
        for h in logging.getLogger(name).handlers
        if isinstance(h, logging.StreamHandler)
    }
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)
