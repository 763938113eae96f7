"""The ``rollflow`` command's parser and dispatch (the commands: ``flows/cli/__init__.py``'s docstring).

What it is: ``main`` (one ``rollflow <command>: error: ...`` line and status 2 for a command line that
cannot work), ``build_parser`` and the dispatch to the commands (``run``, ``resume`` and ``eval`` here:
their trial checked before Prefect starts, ``rollflow.trial.preflight``, then the flow; ``plan`` here;
the others in ``flows.cli.trials``). What it is not: the commands' work.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from flows.cli.inspect_words import inspect_argv, recorded_tokenizer
from flows.cli.paths import DEFAULT_CONFIG, PLAN_CONFIG, config_path, deprecated, find_experiment
from flows.cli.run import run_command
from flows.cli.trials import list_command, query_command, replay_command, view_command
from flows.console import VERBOSE_HELP
from rollflow.api.errors import CommandError, ConfigError
from rollflow.configuration.project_dir import in_dir, project_dir
from rollflow.trial.preflight import check_checkpoint, check_trial
from storage.errors import CheckpointNotFoundError

USAGE_STATUS = 2  # argparse's status for a command line that cannot work


def run_trial(args: argparse.Namespace, *, resume: bool) -> int:
    if resume:
        find_experiment(args)
    check_trial(args.config, args.overrides, trial=args.trial, resume=resume)
    from flows.async_rl import async_rl

    return run_command(
        async_rl, args.config, args.overrides, trial=args.trial, resume=resume, verbose=args.verbose
    )


def eval_trial(args: argparse.Namespace) -> int:
    if args.trial is not None and "=" in args.trial:  # an override, not a trial name
        args.overrides.insert(0, args.trial)
        args.trial = None
    if args.trial_opt is not None:
        deprecated("eval", f"--trial {args.trial_opt}", f"rollflow eval {args.trial_opt}")
    args.trial = args.trial if args.trial is not None else args.trial_opt
    if args.trial is None:
        raise CommandError("name the trial to score: `rollflow eval TRIAL` (`rollflow ls` lists them)")
    find_experiment(args)
    check_checkpoint(args.config, args.overrides, trial=args.trial, version=args.version)
    from flows.evaluate import evaluate
    from flows.local_api import local_prefect_api
    from rollflow.configuration.parameter_secrets import secret_overrides_aside

    with local_prefect_api(), secret_overrides_aside([*args.overrides, f"trial={args.trial}"]) as overrides:
        result = evaluate(config=args.config, overrides=overrides, version=args.version, split=args.split)
    print(json.dumps(result, indent=1, default=str))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from flows.gpu_plan import MissingImageError, gpu_plan

    image = args.image if args.image is not None else os.environ.get("ROLLFLOW_IMAGE", "")
    rates = None
    if (args.train_seqs_per_s is None) != (args.gen_seqs_per_s is None):
        raise CommandError("give both --train-seqs-per-s and --gen-seqs-per-s, or neither")
    if args.train_seqs_per_s is not None:
        rates = (args.train_seqs_per_s, args.gen_seqs_per_s)
    try:  # a one-machine (embedded) config needs no image; the GPU pools do
        plan = gpu_plan(args.config, args.overrides, image=image, rates=rates, gpu_gb=args.gpu_memory_gb)
    except MissingImageError:
        raise CommandError(
            "no container image: the GPU pools run the image built from infra/docker/Dockerfile.gpu; "
            f"name it: `rollflow plan --config {args.config} --image <registry>/rollflow:gpu` "
            "(or export ROLLFLOW_IMAGE=<registry>/rollflow:gpu)"
        ) from None
    print(plan.pop("summary"), end="\n\n")
    print(plan.pop("config"))
    print(json.dumps(plan, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rollflow",
        description="The ``rollflow`` command: run, resume, evaluate, list and inspect trials, and plan the GPU path.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run async-rl on a new trial (or --trial NAME)")
    run.add_argument("--config", default=DEFAULT_CONFIG)
    run.add_argument("--trial", default=None, help="trial name (default: a new one)")
    run.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    run.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20")

    res = sub.add_parser("resume", help="continue a trial; a finished one is only reported")
    res.add_argument("trial")
    res.add_argument("--config", default=DEFAULT_CONFIG)
    res.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    res.add_argument("overrides", nargs="*")

    ev = sub.add_parser("eval", help="score a committed checkpoint of a trial on the held-out split")
    ev.add_argument("trial", nargs="?", default=None, help="the trial (`rollflow ls` lists them)")
    ev.add_argument("--trial", dest="trial_opt", default=None, help=argparse.SUPPRESS)  # the old spelling
    ev.add_argument("--config", default=DEFAULT_CONFIG)
    ev.add_argument("--version", type=int, default=-1, help="checkpoint version (-1 = latest)")
    ev.add_argument("--split", default=None)
    ev.add_argument("overrides", nargs="*")

    ls = sub.add_parser("ls", help="the trials of every experiment: status, latest version, best accuracy")
    ls.add_argument("--config", default=DEFAULT_CONFIG)
    ls.add_argument("overrides", nargs="*", help="dotted overrides, e.g. experiment=other storage.root=...")

    sub.add_parser(
        "inspect", help="decoded trajectories with filters (see `rollflow inspect -h`)", add_help=False
    )

    qry = sub.add_parser("query", help="SQL over a trial's committed trajectories (docs/trajectories.md)")
    qry.add_argument("trial")
    qry.add_argument(
        "sql",
        help='e.g. "SELECT * FROM per_version"; views: trajectories, groups, trained, per_version, per_prompt, commits',
    )
    qry.add_argument("--config", default=DEFAULT_CONFIG)
    qry.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="json: one object per line"
    )
    qry.add_argument("--max-rows", type=int, default=200, help="rows a table shows (csv and json print all)")
    qry.add_argument("overrides", nargs="*")

    view = sub.add_parser("view", help="the trajectory viewer of a trial, served on 127.0.0.1")
    view.add_argument("trial")
    view.add_argument("--config", default=DEFAULT_CONFIG)
    view.add_argument(
        "--host", default="127.0.0.1", help="bind address (not loopback: an API key is required)"
    )
    view.add_argument("--port", type=int, default=8765)
    view.add_argument("--api-key", default=None, help="require this key (default: $ROLLFLOW_VIEWER_API_KEY)")
    view.add_argument("overrides", nargs="*")

    rep = sub.add_parser(
        "replay", help="retrain a trial to vN from its own record, compare with its checkpoint"
    )
    rep.add_argument("trial")
    rep.add_argument("--to", type=int, required=True, help="the version to reach (a committed checkpoint)")
    rep.add_argument("--config", default=DEFAULT_CONFIG)
    rep.add_argument(
        "--from-resume-point", action="store_true", help="start at the newest resume point below --to"
    )
    rep.add_argument("--work-dir", default="runs/replay", help="where the scratch trial is trained")
    rep.add_argument(
        "--keep", action="store_true", help="keep the scratch trial (its checkpoints) afterwards"
    )
    rep.add_argument("overrides", nargs="*")

    plan = sub.add_parser("plan", help="resolve the GPU config, commands and pool variables without a GPU")
    plan.add_argument("--config", default=PLAN_CONFIG)
    plan.add_argument("--image", default=None, help="container image (default: $ROLLFLOW_IMAGE)")
    plan.add_argument(
        "--train-seqs-per-s", type=float, default=None, help="measured: sequences/s the trainer consumes"
    )
    plan.add_argument(
        "--gen-seqs-per-s", type=float, default=None, help="measured: sequences/s one inference server makes"
    )
    plan.add_argument(
        "--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU, to check that the trainer fits"
    )
    plan.add_argument("overrides", nargs="*")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except (CommandError, ConfigError, CheckpointNotFoundError) as exc:
        return _usage_error(argv[0], exc)


def _usage_error(command: str, exc: Exception) -> int:
    """One line on stderr, no traceback: the message already says what to do."""
    print(f"rollflow {command}: error: {exc}", file=sys.stderr)
    return USAGE_STATUS


_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")  # a dotted override: key.path=value


def _main(argv: list[str]) -> int:
    if argv[:1] == ["inspect"]:  # its own parser, and no Prefect import
        from rollflow.rollout.inspect import main as inspect_main

        words = inspect_argv(argv[1:])
        project = project_dir()
        if "--config" in words:
            at = words.index("--config") + 1
            words[at], project = config_path(words[at])
        with in_dir(project):
            return inspect_main(recorded_tokenizer(words), prog="rollflow inspect")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if (
        extra
        and isinstance(getattr(args, "overrides", None), list)
        and all(_OVERRIDE.match(w) for w in extra)
    ):
        args.overrides += extra  # dotted overrides after the options (argparse stops at the first option)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    project = project_dir()
    if getattr(args, "config", None):
        args.config, project = config_path(args.config)
    if (
        str(project) not in sys.path
    ):  # a `module:function` reward in the project imports, as for `python x.py` there
        sys.path.append(str(project))
    with in_dir(project):
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return run_trial(args, resume=False)
    if args.command == "resume":
        return run_trial(args, resume=True)
    if args.command == "eval":
        return eval_trial(args)
    if args.command == "ls":
        return list_command(args)
    if args.command == "query":
        return query_command(args)
    if args.command == "view":
        return view_command(args)
    if args.command == "replay":
        return replay_command(args)
    return _plan(args)


if __name__ == "__main__":
    sys.exit(main())
