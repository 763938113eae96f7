"""Automatic resume of a trial: the budget, kept in the trial's storage, and the failures a resume cannot heal.

What it is:
- ``AutoResumeBudget``: every automatic resume of a trial is one entry of ``orchestration/auto-resumes.json``
  (when, and which flow run it resumed). ``charge`` admits a resume while fewer than ``max_resumes``
  entries fall within the last ``window_s`` seconds, and records it; otherwise it raises
  ``NotResumableError`` saying so. The count lives in storage, not in memory, so every process that
  resumes the trial sees the same budget, and a loop of crashes ends after ``max_resumes``. Worked
  example, ``max_resumes = 3``, ``window_s = 3600``: resumes at t = 0, 10, 20 s are admitted, one at
  t = 30 s is refused; at t = 3601 s the first has left the window and one more is admitted.
- ``not_resumable_reason(exc)``: the reason a failure would only repeat on a resume (a config error, a
  bad dataset, a corrupt model or checkpoint, a reward function that raises on every call), found on
  the exception or its causes; ``None`` for a failure worth resuming (a crash, a lost server, a timeout).
- ``trial_of_flow_run(name)``: the trial of an ``async-rl-<trial>`` flow run (the name the flow gives
  itself once it has chosen its trial).

What it is not: the Prefect trigger (``triggers:`` in prefect.yaml and prefect-gpu.yaml) or the flow's
glue (``flows/auto_resume.py``); nothing here imports Prefect.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from rollflow.api.errors import (
    ConfigError,
    DatasetFileError,
    DatasetRowError,
    NotResumableError,
    RewardFunctionError,
    WorkflowImportError,
)
from storage import keys
from storage.errors import CheckpointIntegrityError

FLOW_RUN_PREFIX = "async-rl-"
_MAX_CAUSES = 8  # how deep to look through __cause__ / __context__


class JsonStore(Protocol):
    def get_json(self, key: str) -> Any: ...

    def put_json(self, key: str, obj: Any) -> None: ...


class AutoResumeBudget:
    """``max_resumes`` automatic resumes of one trial per ``window_s`` seconds (see the module docstring)."""

    def __init__(self, storage: JsonStore, *, max_resumes: int, window_s: float) -> None:
        if max_resumes < 0 or window_s <= 0:
            raise ValueError(f"need max_resumes >= 0 and window_s > 0, got {max_resumes}, {window_s}")
        self.storage, self.max_resumes, self.window_s = storage, max_resumes, window_s

    def entries(self) -> list[dict[str, Any]]:
        """Every recorded automatic resume, oldest first."""
        try:
            doc = self.storage.get_json(keys.AUTO_RESUMES_KEY)
        except FileNotFoundError:
            return []
        return list(doc.get("resumes", [])) if isinstance(doc, dict) else []

    def used(self, now: float | None = None) -> int:
        """Automatic resumes within the window ending at ``now``."""
        now = time.time() if now is None else now
        return sum(1 for e in self.entries() if now - float(e.get("at", 0.0)) < self.window_s)

    def charge(self, *, of: str, by: str = "", now: float | None = None) -> int:
        """Record one automatic resume of flow run ``of`` (by run ``by``); its number within the window.

        Raises:
            NotResumableError: the budget of the window is spent (nothing is recorded then).
        """
        if self.max_resumes == 0:
            raise NotResumableError(
                f"automatic resume is off (orchestration.max_auto_resumes=0); resume {of!r}'s trial by hand"
            )
        now = time.time() if now is None else now
        entries = self.entries()
        recent = [e for e in entries if now - float(e.get("at", 0.0)) < self.window_s]
        if len(recent) >= self.max_resumes:
            raise NotResumableError(
                f"auto-resume budget spent: {len(recent)} automatic resume(s) in the last "
                f"{self.window_s:.0f} s (orchestration.max_auto_resumes={self.max_resumes}); the trial "
                f"keeps failing, so find the cause in the log of {of!r} and resume it by hand once fixed"
            )
        entries.append({"at": now, "of": of, "by": by})
        self.storage.put_json(keys.AUTO_RESUMES_KEY, {"resumes": entries})
        return len(recent) + 1


def trial_of_flow_run(name: str) -> str:
    """``async-rl-<trial>`` -> ``<trial>``.

    Raises:
        NotResumableError: the run never named its trial (it failed before choosing one).
    """
    trial = name[len(FLOW_RUN_PREFIX) :] if name.startswith(FLOW_RUN_PREFIX) else ""
    try:
        return keys.check_name(trial, "trial")
    except ValueError:
        raise NotResumableError(
            f"flow run {name!r} is not named async-rl-<trial>: it failed before it chose its trial, so "
            "there is nothing to resume"
        ) from None


def not_resumable_reason(exc: BaseException) -> str | None:
    """Why resuming after ``exc`` would fail the same way, or None if a resume may heal it."""
    seen: set[int] = set()
    e: BaseException | None = exc
    for _ in range(_MAX_CAUSES):
        if e is None or id(e) in seen:
            return None
        seen.add(id(e))
        reason = _reason_of(e)
        if reason is not None:
            return reason
        e = e.__cause__ or e.__context__
    return None


def _reason_of(e: BaseException) -> str | None:
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, NotResumableError):
        return str(e)
    if isinstance(e, ConfigError | WorkflowImportError):
        return f"config error, fix the config and run again ({text})"
    if isinstance(e, DatasetRowError | DatasetFileError):
        return f"bad dataset, fix the data and run again ({text})"
    if isinstance(e, CheckpointIntegrityError) or type(e).__name__ == "SafetensorError":
        return f"corrupt model or checkpoint: its files fail verification ({text})"
    if isinstance(e, FileNotFoundError) and "model.path" in str(e):
        return f"the base model is missing ({text})"
    if isinstance(e, RewardFunctionError):
        return f"the reward function is broken ({text})"
    return None
