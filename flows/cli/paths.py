"""Where the ``rollflow`` command finds its config and a trial: the checkout, the project directory, the
experiment that holds a named trial.

What it is: ``find_config`` / ``config_path`` (a relative ``--config`` is looked up here, then in the
checkout; the project directory is ``rollflow.configuration.project_dir``'s), ``find_experiment`` (a trial
named for ``resume`` / ``eval`` / ``query`` that is stored under another experiment of the same root) and
``experiment_names``. What it is not: the commands (``flows.cli.app``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollflow.configuration.loader import load_config
from rollflow.configuration.project_dir import project_dir

CHECKOUT = Path(__file__).resolve().parents[2]
# The demo's config: `make demo` trains it, so `rollflow ls` / `resume NAME` find the demo's trials.
DEFAULT_CONFIG = "configs/tiny_hard.yaml"
PLAN_CONFIG = "configs/gsm8k_qwen.yaml"


def find_config(path: str) -> str:
    """``path`` when it is a file here, else the checkout's file of that name (the shipped configs work
    from any directory), as an absolute path; else ``path`` (the loader then says it does not exist)."""
    given = Path(path).expanduser()
    if not given.is_file() and not given.is_absolute() and (CHECKOUT / given).is_file():
        given = CHECKOUT / given
    return str(given.resolve()) if given.is_file() else path


def config_path(path: str) -> tuple[str, Path]:
    """(the config as the command uses it, the project directory it runs in): the config is written
    relative to the project directory when it lies inside it."""
    found = find_config(path)
    project = project_dir()
    try:
        return str(Path(found).relative_to(project)), project
    except ValueError:
        return found, project


def deprecated(command: str, old: str, new: str) -> None:
    print(f"rollflow {command}: `{old}` is deprecated; write `{new}`", file=sys.stderr)


def find_experiment(args: argparse.Namespace) -> None:
    """A trial named for ``resume`` / ``eval`` that is not under the config's experiment but under exactly
    one other experiment of the same storage root (an ``RLRun`` trial, the smoke test's): look there
    (``experiment=E`` is added to the overrides; the trial's recorded config does the rest)."""
    if args.trial is None or any(o.split("=", 1)[0].strip() == "experiment" for o in args.overrides):
        return
    from storage.trial_list import trial_names

    cfg = load_config(args.config, args.overrides)
    root, options = cfg.storage.root, cfg.storage.options
    if args.trial in trial_names(root, cfg.experiment, options):
        return
    found = [e for e in experiment_names(root, options) if args.trial in trial_names(root, e, options)]
    if len(found) == 1:
        args.overrides.append(f"experiment={found[0]}")


def experiment_names(root: str, options: dict[str, str] | None) -> list[str]:
    """The experiment folders under the storage root, sorted ([] when there is none)."""
    from storage.fs import Storage

    probe = Storage.open(root, "_", "_", options)
    top = probe.base.rsplit("/", 2)[0]
    try:
        entries = probe.fs.ls(top, detail=True)
    except FileNotFoundError:
        return []
    names = (str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    return sorted(n for n in names if not n.startswith((".", "_")))
