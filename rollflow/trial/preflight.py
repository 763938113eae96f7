"""What the ``rollflow`` command checks before it starts Prefect, so that a wrong name fails in a second.

What it is:
- ``check_trial`` (``run``, ``resume``): the config resolves and the named trial is what the command
  needs, by the flow's own rule: it opens the trial as the flow will (``rollflow.trial.opening.open_trial``)
  without writing: ``resume`` needs a trial that holds data (and overrides its record allows),
  ``run --trial`` (or ``trial=``) one that holds none;
- ``check_checkpoint`` (``eval``): the trial holds the committed checkpoint asked for;
- ``known_trials``: the trials stored under the config's experiment, for the error message.
Each failure is a ``CommandError`` whose message names what to type instead, e.g.::

    rollflow resume: error: trial 'demo-2026' holds no data under runs/storage/tiny-arith; trials there:
    demo-20261124-235558-f1e5. `rollflow run` starts a new trial (`--trial NAME` names it)

What it is not: the rule itself (the flows decide again when they run, which is what a deployment run
relies on) nor a writer: nothing here changes storage. Nothing here imports Prefect: it runs before it.
"""

from __future__ import annotations

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import CommandError, NothingToResumeError, TrialExistsError
from rollflow.configuration.loader import load_config
from rollflow.configuration.project_dir import runs_hint
from rollflow.trial.naming import requested_trial
from rollflow.trial.opening import open_trial
from rollflow.trial.store import open_trial_storage
from storage.trial_list import experiment_uri, trial_names

MAX_LISTED = 10


def known_trials(cfg: ExperimentConfig) -> list[str]:
    """Trial names under ``{storage.root}/{experiment}/``, sorted; [] when none or the store cannot be listed."""
    try:
        return trial_names(cfg.storage.root, cfg.experiment, cfg.storage.options)
    except Exception:  # only a hint for an error message: never the reason a command fails
        return []


def _experiment_uri(cfg: ExperimentConfig) -> str:
    return experiment_uri(cfg.storage.root, cfg.experiment, cfg.storage.options)


def _trials_there(cfg: ExperimentConfig) -> str:
    trials = known_trials(cfg)
    if not trials:
        return "no trial is stored there"
    shown = trials[-MAX_LISTED:]
    more = f" (and {len(trials) - len(shown)} older)" if len(trials) > len(shown) else ""
    return "trials there: " + ", ".join(shown) + more


def check_trial(config: str | None, overrides: list[str], *, trial: str | None, resume: bool) -> None:
    """Raise ``CommandError`` when ``async-rl`` would refuse this trial (see the module docstring).

    ``ConfigError`` (an unknown key, a missing config file) propagates with its own message.
    """
    cfg = load_config(config, overrides)
    named = requested_trial(cfg, overrides, trial)
    if named is None:
        return  # a new trial: nothing can be in its way
    try:
        open_trial(cfg, trial, resume=resume, overrides=overrides, write=False)
    except NothingToResumeError:
        raise CommandError(
            f"trial {named!r} holds no data under {_experiment_uri(cfg)}{runs_hint(cfg.storage.root)}; "
            f"{_trials_there(cfg)}. `rollflow run` starts a new trial (`--trial NAME` names it)"
        ) from None
    except TrialExistsError:
        raise CommandError(
            f"trial {named!r} already holds data under {_experiment_uri(cfg)}; `rollflow resume {named}` "
            "continues it, `rollflow run` without --trial starts a new trial"
        ) from None


def check_checkpoint(config: str | None, overrides: list[str], *, trial: str, version: int) -> None:
    """Raise ``CommandError`` unless trial ``trial`` holds committed checkpoint ``version`` (-1: any)."""
    from storage.checkpoints import CheckpointStore

    cfg = load_config(config, [*overrides, f"trial={trial}"])
    committed = CheckpointStore(open_trial_storage(cfg)).list_committed()
    if not committed:
        raise CommandError(
            f"trial {trial!r} has no committed checkpoint under {_experiment_uri(cfg)}"
            f"{runs_hint(cfg.storage.root)}; {_trials_there(cfg)}. "
            f"Check the name (and --config: this one is {config}), or train it first with `rollflow run`"
        )
    if version >= 0 and version not in committed:
        listed = ", ".join(str(v) for v in committed[-MAX_LISTED:])
        raise CommandError(
            f"trial {trial!r} has no committed checkpoint {version}; it holds versions {listed} "
            "(older ones are garbage-collected: storage.keep_checkpoints). Leave --version out for the newest"
        )
