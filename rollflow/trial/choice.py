"""Which trial a run works on: a fresh one by default, an existing one only on an explicit resume.

What it is: ``choose_trial`` turns the flow's parameters into a trial name and a ``TrialPlan``:
- no trial named (no ``trial`` parameter, no ``trial=`` override): a new name
  ``{config trial}-{YYYYmmdd-HHMMSS}-{4 hex}``, so every deployment run is its own trial;
- a trial named: ``{date}`` in it becomes today's date (``nightly-{date}`` -> ``nightly-20261124``);
  if the trial already holds data, the run must say ``resume=True`` (else ``TrialExistsError``);
- ``resume=True`` on a trial that finished (its finalization record ``FINALIZED.json`` exists) is a
  no-op that reports: it trains nothing, registers nothing and logs nothing. On a trial that is
  ``trained`` (the trainer wrote DONE.json, the finalization record is missing: stopped in between) it
  runs the missing finalization steps (``rollflow.trial.finalization``). On an unfinished trial it
  continues it.
What it is not: the names themselves (``rollflow.trial.naming``), the resume mechanics (the trainer and
rollout restore their own state from storage), the settings a resume runs with (the trial's recorded
config: ``rollflow.trial.resume_policy``), or Prefect: ``rollflow.trial.opening`` calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rollflow.api.errors import NothingToResumeError, TrialExistsError
from rollflow.trial.naming import expand_trial_name, fresh_trial_name
from storage.checkpoints import CheckpointStore
from storage.finalization import read_finalized
from storage.fs import Storage

TrialState = Literal["new", "unfinished", "trained", "finished"]


@dataclass(frozen=True)
class TrialPlan:
    trial: str
    state: TrialState
    resume: bool
    done: dict[str, Any] | None = None  # the trainer's DONE.json for a trained or finished trial


def trial_state(storage: Storage) -> tuple[TrialState, dict[str, Any] | None]:
    """new: nothing stored; finished: the finalization record exists; trained: the trainer's done
    marker exists and the record does not; unfinished: anything else."""
    done = CheckpointStore(storage).is_done()
    if done is not None:
        return ("finished" if read_finalized(storage) is not None else "trained"), done
    return ("unfinished" if storage.list_dirs("") else "new"), None


def choose_trial(
    base: str, *, named: str | None, resume: bool, open_storage: Callable[[str], Storage]
) -> TrialPlan:
    """``base``: the config's trial; ``named``: the trial the caller asked for (None = a new one);
    ``open_storage(trial)`` opens that trial's storage."""
    if named is None:
        if resume:
            raise NothingToResumeError("resume", "resume=true needs the trial to resume: pass trial=<name>")
        return TrialPlan(fresh_trial_name(base), "new", resume=False)
    trial = expand_trial_name(named)
    state, done = trial_state(open_storage(trial))
    if state == "new" and resume:
        raise NothingToResumeError(
            "resume", f"trial {trial!r} holds no data; drop resume=true to start it, or check the name"
        )
    if state != "new" and not resume:
        raise TrialExistsError(
            "trial",
            f"trial {trial!r} already exists ({state}); pass resume=true (`rollflow resume {trial}`) to "
            "continue it, or leave the trial unset for a new one",
        )
    return TrialPlan(trial, state, resume=resume, done=done)
