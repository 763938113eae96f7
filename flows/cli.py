"""The ``rollflow`` command: run, resume, evaluate, list and inspect trials, and plan the GPU path.

    rollflow run [--config C] [--trial T] [-v] [dotted.overrides ...]  a new trial (or the named one)
    rollflow resume TRIAL [--config C] [-v] [dotted.overrides ...]     continue TRIAL (a finished one: no-op)
    rollflow eval --trial T [--config C] [--version V] [--split S]   score a checkpoint of T
    rollflow ls [--config C] [experiment=E ...]                      the trials: status, version, best accuracy
    rollflow inspect [--config C] [trial=T ...] [--min-reward R] [--version LO:HI] [--prompt TEXT]
    rollflow plan [--config configs/gsm8k_qwen.yaml] --image IMG    the GPU path, resolved without a GPU

``run``, ``resume`` and ``eval`` run the flows in this process: against ``PREFECT_API_URL`` when it is
set (the runs show in that server's UI), else against a private API server that dies with this process.
To run on a worker instead, use ``prefect deployment run 'async-rl/local'`` (docs/operations.md).
``ls`` and ``inspect`` read storage only and never import Prefect, so they answer in about a second;
``inspect`` on a trial that is not stored says ``no such trial: ...`` (status 2), which is not what it
says when the filters match nothing.

A command line that cannot work (an unknown config key, a trial that holds no data for ``resume`` or
already holds some for ``run --trial``, a checkpoint that is not there, ``plan`` without an image) ends
with one ``rollflow <command>: error: ...`` line saying what to type instead, and exit status 2; ``run``,
``resume`` and ``eval`` check their trial before they start Prefect (``flows/preflight.py``). Ctrl-C
during ``run`` or ``resume`` prints one line (the trial kept, its resume point, the command that
resumes it) and exits with status 130 (``flows/interrupt.py``).

It lives in ``flows/`` (not ``rollflow/``) because it calls flows, and ``rollflow/`` never imports Prefect.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from flows.console import VERBOSE_HELP
from flows.preflight import CommandError, check_checkpoint, check_trial
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config
from storage.errors import CheckpointNotFoundError

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"
USAGE_STATUS = 2  # argparse's status for a command line that cannot work


def _run(args: argparse.Namespace, *, resume: bool) -> int:
    check_trial(args.config, args.overrides, trial=args.trial, resume=resume)
    from flows.async_rl import run_command

    return run_command(args.config, args.overrides, trial=args.trial, resume=resume, verbose=args.verbose)


def _eval(args: argparse.Namespace) -> int:
    check_checkpoint(args.config, args.overrides, trial=args.trial, version=args.version)
    from flows.evaluate import evaluate
    from flows.local_api import local_prefect_api
    from rollflow.configuration.parameter_secrets import secret_overrides_aside

    with local_prefect_api(), secret_overrides_aside([*args.overrides, f"trial={args.trial}"]) as overrides:
        result = evaluate(config=args.config, overrides=overrides, version=args.version, split=args.split)
    print(json.dumps(result, indent=1, default=str))
    return 0


def _ls(args: argparse.Namespace) -> int:
    """The trials under the config's storage root and experiment (``storage.trial_list``)."""
    from storage.trial_list import experiment_uri, format_trials, list_trials

    cfg = load_config(args.config, args.overrides)
    where = experiment_uri(cfg.storage.root, cfg.experiment, cfg.storage.options)
    trials = list_trials(
        cfg.storage.root, cfg.experiment, cfg.storage.options, active_within_s=cfg.rollout.worker_lease_s
    )
    if not trials:
        print(f"no trial is stored under {where} (`rollflow run` starts one)")
        return 0
    print(format_trials(trials))
    print(f"{len(trials)} trial(s) under {where}")
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
        plan = gpu_plan(args.config, args.overrides, image=image, rates=rates)
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
    p = argparse.ArgumentParser(prog="rollflow", description=__doc__.splitlines()[0])
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
    ev.add_argument("--trial", required=True)
    ev.add_argument("--config", default=DEFAULT_CONFIG)
    ev.add_argument("--version", type=int, default=-1, help="checkpoint version (-1 = latest)")
    ev.add_argument("--split", default=None)
    ev.add_argument("overrides", nargs="*")

    ls = sub.add_parser("ls", help="the trials stored: status, latest version, best held-out accuracy")
    ls.add_argument("--config", default=DEFAULT_CONFIG)
    ls.add_argument("overrides", nargs="*", help="dotted overrides, e.g. experiment=other storage.root=...")

    sub.add_parser(
        "inspect", help="decoded trajectories with filters (see `rollflow inspect -h`)", add_help=False
    )

    plan = sub.add_parser("plan", help="resolve the GPU config, commands and pool variables without a GPU")
    plan.add_argument("--config", default="configs/gsm8k_qwen.yaml")
    plan.add_argument("--image", default=None, help="container image (default: $ROLLFLOW_IMAGE)")
    plan.add_argument(
        "--train-seqs-per-s", type=float, default=None, help="measured: sequences/s the trainer consumes"
    )
    plan.add_argument(
        "--gen-seqs-per-s", type=float, default=None, help="measured: sequences/s one inference server makes"
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


def _main(argv: list[str]) -> int:
    if argv[:1] == ["inspect"]:  # its own parser, and no Prefect import
        from rollflow.rollout.inspect import main as inspect_main

        return inspect_main(argv[1:], prog="rollflow inspect")
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args, resume=False)
    if args.command == "resume":
        return _run(args, resume=True)
    if args.command == "eval":
        return _eval(args)
    if args.command == "ls":
        return _ls(args)
    return _plan(args)


if __name__ == "__main__":
    sys.exit(main())
