"""The ``rollflow`` command: run, resume, evaluate, list and inspect trials, and plan the GPU path.

    rollflow run [--config C] [--trial T] [-v] [dotted.overrides ...]  a new trial (or the named one)
    rollflow resume TRIAL [--config C] [-v] [dotted.overrides ...]     continue TRIAL (a finished one: no-op)
    rollflow eval TRIAL [--config C] [--version V] [--split S]       score a checkpoint of TRIAL
    rollflow ls [--config C] [experiment=E ...]                      the trials of every experiment (or of E)
    rollflow inspect TRIAL [--config C] [--min-reward R] [--version LO:HI] [--prompt TEXT]
    rollflow plan [--config configs/gsm8k_qwen.yaml] --image IMG    the GPU path, resolved without a GPU

A trial is named the same way everywhere: the word after the command (``resume TRIAL``, ``eval TRIAL``,
``inspect TRIAL``); ``run --trial NAME`` names a new one. The old spellings ``eval --trial T`` and
``inspect trial=T`` still work and say so on stderr.

Where it looks: ``--config`` defaults to the demo's config (``configs/tiny_hard.yaml``, the one ``make demo``
trains), found in the checkout from any directory; a relative ``--config`` is looked up in the current
directory, then in the checkout. Relative paths inside the config (``storage.root: runs/storage``,
``model.path``) are relative to the project directory, as for ``RLRun``
(``rollflow.configuration.project_dir``): ``$ROLLFLOW_PROJECT_DIR`` when set, else the current directory.
So ``rollflow ls`` in a folder lists the trials made there, by ``make demo`` in the checkout or by an
``RLRun`` script in a folder of your own. ``resume`` and ``eval`` find a trial
stored under another experiment of the same root (``_find_experiment``); ``inspect`` decodes with the
tokenizer of the model the trial recorded.
    rollflow query TRIAL "SELECT ..." [--config C] [--format F]      SQL over the committed trajectories
    rollflow view TRIAL [--config C] [--port P] [--api-key K]        the trajectory viewer on 127.0.0.1
    rollflow replay TRIAL --to N [--config C] [--from-resume-point]  retrain to vN from the record, compare

``run``, ``resume`` and ``eval`` run the flows in this process: against ``PREFECT_API_URL`` when it is
set (the runs show in that server's UI), else against a private API server that dies with this process.
To run on a worker instead, use ``prefect deployment run 'async-rl/local'`` (docs/operations.md).
``ls`` and ``inspect`` read storage only and never import Prefect, so they answer in about a second;
``inspect`` on a trial that is not stored says ``no such trial: ...`` (status 2), which is not what it
says when the filters match nothing.

A command line that cannot work (an unknown config key, a trial that holds no data for ``resume`` or
already holds some for ``run --trial``, a checkpoint that is not there, ``plan`` without an image) ends
with one ``rollflow <command>: error: ...`` line saying what to type instead, and exit status 2; ``run``,
``resume`` and ``eval`` check their trial before they start Prefect (``rollflow/trial/preflight.py``). Ctrl-C
during ``run`` or ``resume`` prints one line (the trial kept, its resume point, the command that
resumes it) and exits with status 130 (``flows/interrupt.py``).

It lives in ``flows/`` (not ``rollflow/``) because it calls flows, and ``rollflow/`` never imports Prefect.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from flows.console import VERBOSE_HELP
from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import CommandError, ConfigError
from rollflow.configuration.loader import load_config
from rollflow.configuration.project_dir import in_dir, project_dir, runs_hint
from rollflow.trial.preflight import check_checkpoint, check_trial
from storage.errors import CheckpointNotFoundError

CHECKOUT = Path(__file__).resolve().parents[1]
# The demo's config: `make demo` trains it, so `rollflow ls` / `resume NAME` find the demo's trials.
DEFAULT_CONFIG = "configs/tiny_hard.yaml"
PLAN_CONFIG = "configs/gsm8k_qwen.yaml"
USAGE_STATUS = 2  # argparse's status for a command line that cannot work


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


def _deprecated(command: str, old: str, new: str) -> None:
    print(f"rollflow {command}: `{old}` is deprecated; write `{new}`", file=sys.stderr)


def _find_experiment(args: argparse.Namespace) -> None:
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


def _run(args: argparse.Namespace, *, resume: bool) -> int:
    if resume:
        _find_experiment(args)
    check_trial(args.config, args.overrides, trial=args.trial, resume=resume)
    from flows.async_rl import run_command

    return run_command(args.config, args.overrides, trial=args.trial, resume=resume, verbose=args.verbose)


def _eval(args: argparse.Namespace) -> int:
    if args.trial is not None and "=" in args.trial:  # an override, not a trial name
        args.overrides.insert(0, args.trial)
        args.trial = None
    if args.trial_opt is not None:
        _deprecated("eval", f"--trial {args.trial_opt}", f"rollflow eval {args.trial_opt}")
    args.trial = args.trial if args.trial is not None else args.trial_opt
    if args.trial is None:
        raise CommandError("name the trial to score: `rollflow eval TRIAL` (`rollflow ls` lists them)")
    _find_experiment(args)
    check_checkpoint(args.config, args.overrides, trial=args.trial, version=args.version)
    from flows.evaluate import evaluate
    from flows.local_api import local_prefect_api
    from rollflow.configuration.parameter_secrets import secret_overrides_aside

    with local_prefect_api(), secret_overrides_aside([*args.overrides, f"trial={args.trial}"]) as overrides:
        result = evaluate(config=args.config, overrides=overrides, version=args.version, split=args.split)
    print(json.dumps(result, indent=1, default=str))
    return 0


def _ls(args: argparse.Namespace) -> int:
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


def _trial_storage(args: argparse.Namespace) -> ExperimentConfig:
    """The trial's config for ``query`` / ``view`` / ``replay``: its recorded one (``record/config.json``:
    its model, so its tokenizer; its batch size) when there is one, else the config and overrides. The
    trial may be under another experiment of the root (``_find_experiment``); one that holds nothing is
    ``no such trial`` (status 2)."""
    from rollflow.rollout.inspect import no_such_trial
    from rollflow.trial.record import read_config_record
    from rollflow.trial.resume_policy import resume_config
    from rollflow.trial.store import open_trial_storage

    _find_experiment(args)
    fresh = load_config(args.config, [*args.overrides, f"trial={args.trial}"])
    storage = open_trial_storage(fresh)
    if not storage.list_dirs(""):
        raise CommandError(
            no_such_trial(fresh.storage.root, fresh.experiment, args.trial, fresh.storage.options)
        )
    record = read_config_record(storage)
    if record is None:
        return fresh
    try:
        return resume_config(record, fresh, [], trained_version=0).cfg
    except ConfigError:  # a record this code cannot load: the config given
        return fresh


def _query(args: argparse.Namespace) -> int:
    """SQL over the trial's committed trajectories (``storage.query``; views in docs/trajectories.md)."""
    from rollflow.viewer.trial import format_result, query_trial
    from storage.errors import QueryError

    cfg = _trial_storage(args)
    try:
        table = query_trial(cfg, args.sql, trial=args.trial)
    except QueryError as exc:
        raise CommandError(str(exc)) from None
    print(format_result(table, args.format, max_rows=args.max_rows), end="")
    return 0


def _view(args: argparse.Namespace) -> int:
    """Serve the trajectory viewer of one trial until Ctrl-C (``rollflow.viewer.server``)."""
    from rollflow.api.errors import ViewerInputError
    from rollflow.viewer.pages import Pages
    from rollflow.viewer.server import API_KEY_ENV, ViewerServer
    from rollflow.viewer.trial import load_decoder, open_query

    cfg = _trial_storage(args)
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


def _replay(args: argparse.Namespace) -> int:
    """Retrain the trial to ``--to`` from its own record and compare bit for bit (``rollflow.training.replay``);
    status 0 when every compared version is identical, 1 when one differs."""
    from rollflow.training.replay import ReplayError, replay
    from rollflow.trial.record import read_config_record
    from rollflow.trial.store import open_trial_storage

    cfg = _trial_storage(args)  # the recorded config; no such trial: status 2
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


def _inspect_argv(argv: list[str]) -> list[str]:
    """``inspect TRIAL ...`` in the words of ``rollflow.rollout.inspect``'s parser: ``--trial TRIAL`` and,
    unless a store is named, the default ``--config`` (``trial=T``, the old spelling, still works)."""
    out: list[str] = []
    trial = None
    takes_value = {"--config", "--storage-root", "--experiment", "--trial", "--tokenizer", "--limit",
                   "--width", "--min-reward", "--max-reward", "--version", "--prompt", "--storage-option"}  # fmt: skip
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in takes_value and i + 1 < len(argv):
            out += [word, argv[i + 1]]
            i += 2
            continue
        if word.startswith("trial="):
            _deprecated("inspect", word, f"rollflow inspect {word[6:]}")
            trial = word[6:]
        elif not word.startswith("-") and "=" not in word and trial is None and "--trial" not in argv:
            trial = word
        else:
            out.append(word)
        i += 1
    if trial is not None:
        out += ["--trial", trial]
    if "--config" not in out and "--storage-root" not in out and not {"-h", "--help"} & set(out):
        out += ["--config", DEFAULT_CONFIG]
    return out


def _recorded_tokenizer(words: list[str]) -> list[str]:
    """``--tokenizer`` from the trial's own config record (its ``model.path``), when none is given: a
    trial of another config (an ``RLRun`` trial, another task) is decoded with its own model's tokenizer."""
    if "--tokenizer" in words or "--trial" not in words or "--config" not in words:
        return words
    from rollflow.trial.record import read_config_record
    from rollflow.trial.store import open_trial_storage

    trial = words[words.index("--trial") + 1]
    overrides = [w for w in words if "=" in w and not w.startswith("-")]
    try:
        cfg = load_config(words[words.index("--config") + 1], [*overrides, f"trial={trial}"])
        record = read_config_record(open_trial_storage(cfg))
    except Exception:  # only a better default: inspect itself says what is wrong with the names
        return words
    path = (record or {}).get("config", {}).get("model", {}).get("path")
    return [*words, "--tokenizer", path] if isinstance(path, str) and Path(path).is_dir() else words


_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")  # a dotted override: key.path=value


def _main(argv: list[str]) -> int:
    if argv[:1] == ["inspect"]:  # its own parser, and no Prefect import
        from rollflow.rollout.inspect import main as inspect_main

        words = _inspect_argv(argv[1:])
        project = project_dir()
        if "--config" in words:
            at = words.index("--config") + 1
            words[at], project = config_path(words[at])
        with in_dir(project):
            return inspect_main(_recorded_tokenizer(words), prog="rollflow inspect")
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
        return _run(args, resume=False)
    if args.command == "resume":
        return _run(args, resume=True)
    if args.command == "eval":
        return _eval(args)
    if args.command == "ls":
        return _ls(args)
    if args.command == "query":
        return _query(args)
    if args.command == "view":
        return _view(args)
    if args.command == "replay":
        return _replay(args)
    return _plan(args)


if __name__ == "__main__":
    sys.exit(main())
