"""A trial's name: the one a run asks for, today's date in it, or a fresh one.

What it is:
- ``expand_trial_name``: ``{date}`` -> today's date (UTC, YYYYmmdd), ``{time}`` -> HHMMSS
  (``nightly-{date}`` -> ``nightly-20261124``);
- ``fresh_trial_name``: ``{config trial}-{YYYYmmdd-HHMMSS}-{4 hex}``, the name of every new trial;
- ``requested_trial``: the trial a run names (the ``trial`` argument, else a ``trial=`` override), or None;
- ``trial_to_run``: the name a run will have, worked out before the flow starts (so that the flow run's
  name, Ctrl-C's line and the flow agree): a named trial expanded, else a fresh name.

What it is not: whether that trial may run (``rollflow.trial.choice``), nor its record. No I/O.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from rollflow.api.config import ExperimentConfig


def expand_trial_name(name: str, now: float | None = None) -> str:
    """Replace ``{date}`` with today's date (UTC, YYYYmmdd) and ``{time}`` with HHMMSS."""
    t = time.gmtime(now)
    return name.replace("{date}", time.strftime("%Y%m%d", t)).replace("{time}", time.strftime("%H%M%S", t))


def fresh_trial_name(base: str, now: float | None = None) -> str:
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(2)}"


def named_in_overrides(overrides: Sequence[str]) -> bool:
    return any(o.split("=", 1)[0].strip() == "trial" for o in overrides)


def requested_trial(cfg: ExperimentConfig, overrides: Sequence[str], trial: str | None) -> str | None:
    """``trial`` when given, else the config's trial when an override names it, else None (a new one)."""
    if trial is not None:
        return trial
    return cfg.trial if named_in_overrides(overrides) else None


def trial_to_run(cfg: ExperimentConfig, overrides: Sequence[str], trial: str | None) -> tuple[str, bool]:
    """(the trial a run of ``cfg`` works on, whether it is a fresh name) (module docstring)."""
    named = requested_trial(cfg, overrides, trial)
    return (expand_trial_name(named), False) if named is not None else (fresh_trial_name(cfg.trial), True)
