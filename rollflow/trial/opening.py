"""``open_trial``: the one way a run gets its trial, its state and the config it runs with.

What it is: the flow (``flows/async_rl.py``) and the command line's check (``rollflow.trial.preflight``)
open a trial the same way; ``rollflow run``, ``rollflow resume`` and ``RLRun.train()`` reach it through
the flow. In order:

1. the name: the ``trial`` argument, else a ``trial=`` override, else the fresh name the run announced
   (``planned``; ``rollflow.trial.naming``);
2. the choice: new, unfinished, trained or finished, and whether the run may work on it
   (``rollflow.trial.choice``: ``TrialExistsError``, ``NothingToResumeError``);
3. for a new trial that retrains from the registry: the registered policy and a fresh data draw
   (``rollflow.trial.retrain``);
4. the config: a new trial's, recorded now; an existing one's recorded config with the resume's overrides
   on top, recorded again (``rollflow.trial.resume_policy``).

``write=False`` does all of it and raises the same errors, but writes nothing and downloads nothing (the
command line's check before Prefect starts).
What it is not: Prefect (no flow-run names, no run logger: ``warn`` says what a resume changes) or the run
itself; nothing here trains, scores or tracks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollflow.api.config import ExperimentConfig
from rollflow.trial.choice import TrialPlan, TrialState, choose_trial
from rollflow.trial.naming import requested_trial
from rollflow.trial.resume_policy import ResumedConfig, pinned_overrides, resume_tags, settle_config
from rollflow.trial.store import open_trial_storage
from storage.fs import Storage


@dataclass(frozen=True)
class OpenTrial:
    """A trial as a run opened it: the config it runs with (``cfg.trial`` is its name) and what it is."""

    cfg: ExperimentConfig
    plan: TrialPlan
    resumed: ResumedConfig
    source_version: str | None = None  # the registered version a retrain starts from

    @property
    def state(self) -> TrialState:
        return self.plan.state

    @property
    def done(self) -> dict:
        """The trainer's DONE.json ({} unless the trial is trained or finished)."""
        return self.plan.done or {}

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags: every override given on a resume of this trial (``resume_tags``)."""
        return resume_tags(self.resumed)

    @property
    def pinned_overrides(self) -> list[str]:
        """Overrides that make a child process resolve the recorded config (``pinned_overrides``)."""
        return pinned_overrides(self.resumed)

    def storage(self) -> Storage:
        return open_trial_storage(self.cfg)

    def describe(self) -> str:
        return f"trial {self.cfg.trial} ({self.state}{', resume' if self.plan.resume else ''})"


def open_trial(
    cfg: ExperimentConfig,
    trial: str | None,
    *,
    resume: bool,
    overrides: Sequence[str],
    planned: str | None = None,
    retrain_from_registry: bool = False,
    warn: Callable[[str], None] | None = None,
    write: bool = True,
) -> OpenTrial:
    """Open the trial a run of ``cfg`` works on (module docstring). ``cfg``: the config resolved from the
    YAML or settings and ``overrides``; ``trial``: the trial asked for (None: a new one, named ``planned``
    when given).

    Raises:
        TrialExistsError, NothingToResumeError: the trial's state does not fit ``resume``.
        ResumeOverrideError: an override would contradict the trial's record.
    """
    named = requested_trial(cfg, overrides, trial)
    if named is None and not resume:
        named = planned
    plan = choose_trial(
        cfg.trial, named=named, resume=resume, open_storage=lambda t: open_trial_storage(cfg, t)
    )
    cfg = dataclasses.replace(cfg, trial=plan.trial)
    source_version = None
    if retrain_from_registry and plan.state == "new" and write:
        from rollflow.trial.retrain import from_registry

        cfg, source_version = from_registry(cfg)
    resumed = settle_config(
        open_trial_storage(cfg), cfg, state=plan.state, overrides=overrides, warn=warn, write=write
    )
    return OpenTrial(resumed.cfg, plan, resumed, source_version)
