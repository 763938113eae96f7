"""``rollflow ls``, ``query``, ``view`` and ``replay``: what storage holds of the trials, read without Prefect.

What it is: the commands that read a trial's storage (``storage.trial_list`` for ``ls``; the trial's
recorded config, ``rollflow.trial.resume_policy.recorded_config``, for the others). What it is not: the
readers themselves (``rollflow.viewer``, ``storage.query``, ``rollflow.training.replay``).
"""

from __future__ import annotations

import argparse
import os

from flows.cli.paths import experiment_names, find_experiment
from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import CommandError, ConfigError
from rollflow.configuration.loader import load_config
from rollflow.configuration.project_dir import runs_hint
from rollflow.trial.store import open_trial_storage


def list_command(args: argparse.Namespace) -> int:
    """The trials of every experiment under the config's storage root, or of ``experiment=E`` only
    (``storage.trial_list``)."""
    from storage.trial_list import experiment_uri, format_trials, list_trials

    cfg = load_config(args.config, args.overrides)
    one = any(o.split("=", 1)[0].strip() == "experiment" for o in args.overrides)
    experiments = [cfg.experiment] if one else experiment_names(cfg.storage.root, cfg.storage.options)
    shown = 0
    for experiment in experiments:
        trials = list_trials(
            cfg.storage.root, experiment, cfg.storage.options, active_within_s=cfg.rollout.worker_lease_s
        )
        if trials:
            if not one:
                print(
                    f"experiment {experiment} ({experiment_uri(cfg.storage.root, experiment, cfg.storage.options)}):"
                )
            print(format_trials(trials), end="\n\n" if not one else "\n")
            shown += len(trials)
    where = experiment_uri(cfg.storage.root, cfg.experiment, cfg.storage.options)
    if not one:
        where = where.rsplit("/", 1)[0]
    if not shown:
        print(f"no trial is stored under {where}{runs_hint(cfg.storage.root)} (`rollflow run` starts one)")
        return 0
    print(f"{shown} trial(s) under {where}")
    return 0


def _recorded_trial_config(args: argparse.Namespace) -> ExperimentConfig:
    """The trial's config for ``query`` / ``view`` / ``replay``: its recorded one (``record/config.json``:
    its model, so its tokenizer; its batch size) when there is one, else the config and overrides. The
    trial may be under another experiment of the root (``find_experiment``); one that holds nothing is
    ``no such trial`` (status 2)."""
    from rollflow.rollout.inspect import no_such_trial
    from rollflow.trial.resume_policy import recorded_config

    find_experiment(args)
    fresh = load_config(args.config, [*args.overrides, f"trial={args.trial}"])
    if not open_trial_storage(fresh).list_dirs(""):
        raise CommandError(
            no_such_trial(fresh.storage.root, fresh.experiment, args.trial, fresh.storage.options)
        )
    try:
        return recorded_config(fresh)
    except ConfigError:  # a record this code cannot load: the config given
        return fresh


def query_command(args: argparse.Namespace) -> int:
    """SQL over the trial's committed trajectories (``storage.query``; views in docs/trajectories.md)."""
    from rollflow.viewer.trial import format_result, query_trial
    from storage.errors import QueryError

    cfg = _recorded_trial_config(args)
    try:
        table = query_trial(cfg, args.sql, trial=args.trial)
    except QueryError as exc:
        raise CommandError(str(exc)) from None
    print(format_result(table, args.format, max_rows=args.max_rows), end="")
    return 0


def view_command(args: argparse.Namespace) -> int:
    """Serve the trajectory viewer of one trial until Ctrl-C (``rollflow.viewer.server``)."""
    from rollflow.api.errors import ViewerInputError
    from rollflow.viewer.pages import Pages
    from rollflow.viewer.server import API_KEY_ENV, ViewerServer
    from rollflow.viewer.trial import load_decoder, open_query

    cfg = _recorded_trial_config(args)
    decoder = load_decoder(cfg.model.path)
    pages = Pages(
        open_query(cfg, args.trial, decoder=decoder), decoder, title=f"{cfg.experiment} / {args.trial}"
    )
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        server = ViewerServer(pages, host=args.host, port=args.port, api_key=api_key)
    except ViewerInputError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}:{args.port} ({exc}); pick another --port") from None
    print(
        f"trajectories of {cfg.experiment}/{args.trial}: {server.url}{'?key=<your key>' if api_key else ''} (Ctrl-C stops)"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def replay_command(args: argparse.Namespace) -> int:
    """Retrain the trial to ``--to`` from its own record and compare bit for bit (``rollflow.training.replay``);
    status 0 when every compared version is identical, 1 when one differs."""
    from rollflow.training.replay import ReplayError, replay
    from rollflow.trial.record import read_config_record

    cfg = _recorded_trial_config(args)  # the recorded config; no such trial: status 2
    storage = open_trial_storage(cfg)
    if read_config_record(storage) is None:
        print(f"trial {args.trial} has no config record: replaying with {args.config} and the overrides")
    try:
        report = replay(
            cfg,
            storage,
            to_version=args.to,
            work_dir=args.work_dir,
            from_resume_point=args.from_resume_point,
            keep=args.keep,
        )
    except ReplayError as exc:
        raise CommandError(str(exc)) from None
    print(report.summary())
    return 0 if report.identical else 1
