"""What the ``rollflow`` command checks before it starts Prefect, so that a wrong name fails in a second.

What it is:
- ``check_trial`` (``run``, ``resume``): the config resolves and the named trial is what the command
  needs, by the flow's own rule (``rollflow.trials.choose_trial``): ``resume`` needs a trial that holds
  data, ``run --trial`` (or ``trial=``) one that holds none;
- ``check_checkpoint`` (``eval``): the trial holds the committed checkpoint asked for;
- ``known_trials``: the trials stored under the config's experiment, for the error message.
Each failure is a ``CommandError`` whose message names what to type instead, e.g.::

    rollflow resume: error: trial 'demo-2026' holds no data under runs/storage/tiny-arith; trials there:
    demo-20261124-235558-f1e5. `rollflow run` starts a new trial (`--trial NAME` names it)

What it is not: the rule itself (the flows decide again when they run, which is what a deployment run
relies on) nor a writer: nothing here changes storage.
"""

from __future__ import annotations

from rollflow.api.config import ExperimentConfig
from rollflow.configuration.loader import load_config
from rollflow.configuration.project_dir import runs_hint
from rollflow.configuration.trial_storage import open_trial_storage
from storage.fs import Storage

MAX_LISTED = 10


class CommandError(Exception):
    """A ``rollflow`` command line that cannot work as given; the message says what to type instead."""


def _open(cfg: ExperimentConfig, trial: str) -> Storage:

    return open_trial_storage(cfg, trial)


def known_trials(cfg: ExperimentConfig) -> list[str]:
    """Trial names under ``{storage.root}/{experiment}/``, sorted; [] when none or the store cannot be listed."""
    try:
        storage = _open(cfg, cfg.trial)
        parent = storage.base.rsplit("/", 1)[0]
        entries = storage.fs.ls(parent, detail=True)
    except Exception:  # only a hint for an error message: never the reason a command fails
        return []
    names = (str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    return sorted(n for n in names if not n.startswith("."))


def _experiment_uri(cfg: ExperimentConfig) -> str:
    return _open(cfg, cfg.trial).root_uri.rsplit("/", 1)[0]


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
    from rollflow.trials import NothingToResumeError, TrialExistsError, choose_trial, named_in_overrides

    cfg = load_config(config, overrides)
    named = trial if trial is not None else (cfg.trial if named_in_overrides(overrides) else None)
    if named is None:
        return  # a new trial: nothing can be in its way
    try:
        choose_trial(cfg.trial, named=named, resume=resume, open_storage=lambda t: _open(cfg, t))
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
    committed = CheckpointStore(_open(cfg, cfg.trial)).list_committed()
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
