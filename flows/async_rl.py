"""The main flow: fully asynchronous RL on one config.

Embedded mode (one machine): bootstrap the policy, start the inference servers, score the base
policy, then run the rollout loop, the train loop and the periodic evaluation concurrently; when the
trainer writes its done marker everything stops, the final policy is scored and registered in MLflow,
and a summary comes back (final version, accuracies, MLflow run id, storage URIs).
Distributed mode (``flows/distributed.py``): the same story, with the train loop and N rollout workers
as `train` and `rollout` deployment runs on their work pools, sharing the storage root and MLflow run.

A trial is whole once it is finalized (final evaluation, registry decision, MLflow run ended, then
FINALIZED.json: ``tasks/finalize.py``); resuming a trial stopped after training runs what it missed.

Run it:  python -m flows.async_rl --config configs/tiny_cpu.yaml train.steps=20    (-v: every step)
   or:   prefect deployment run 'async-rl/local' --param overrides='["train.steps=20"]'
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from flows.auto_resume import begin_auto_resume, charge_auto_resume, not_resumable_state
from flows.console import VERBOSE_HELP
from flows.distributed import run_distributed
from flows.end_state import state_real_end_states
from flows.run_name import async_rl_run_name, planned_trial
from rollflow.api.config import ExperimentConfig
from rollflow.configuration.parameter_secrets import refuse_secret_overrides_for_other_processes
from rollflow.configuration.trial_storage import open_trial_storage
from rollflow.data.preload import preload_libraries
from rollflow.trial_record import pinned_overrides, resume_tags, settle_config
from rollflow.trials import choose_trial, named_in_overrides
from tasks.bootstrap import bootstrap_model
from tasks.distributed import writer_name_for
from tasks.evaluate import eval_loop, evaluate_policy
from tasks.finalize import finalize_trained, finish_tracking, publish_summary, record_finalized
from tasks.lineage import run_lineage
from tasks.loops import join_loops
from tasks.progress import RunProgress
from tasks.rollout import rollout_loop
from tasks.runtime import (
    config_data,
    configure_process_env,
    core_logs_to_this_run,
    is_interruption,
    name_flow_run,
    resolve_config,
)
from tasks.servers import start_servers, stop_servers
from tasks.train import train_loop

if TYPE_CHECKING:
    from rollflow.tracking.mlflow_tracker import MlflowTracker
    from tasks.runtime import RunLogger

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"


def _run_embedded(cfg: ExperimentConfig, tracker: MlflowTracker | None, logger: RunLogger) -> dict[str, Any]:
    """Servers, then the three loops side by side; on any exit the loops stop and the servers go.

    A loop that was interrupted (cancel, SIGTERM, a failure elsewhere) ends its task run Cancelled;
    a failure is re-raised before a cancellation so the cause is what the flow run reports."""
    from rollflow.configuration.layout import describe_layout
    from rollflow.timing.clock import Timeline
    from rollflow.timing.report import TimingReporter, bounds

    sink = tracker.sink if tracker else None
    model_path = bootstrap_model(cfg)
    servers = start_servers(cfg, model_path)
    logger.info("layout: %s", describe_layout(cfg))
    stop = threading.Event()
    timeline = Timeline()  # where the time goes: every role's states, cores and servers (rollflow.timing)
    reporter = TimingReporter(
        timeline,
        sink,
        addresses=servers.addresses,
        api_key=cfg.inference.api_key,
        pids={"flow": os.getpid(), **servers.pids()},
    )
    timing: dict[str, Any] = {}
    # one line per 10 % of the run from what every loop logs (tasks/progress.py); the loops' own
    # per-step and per-evaluation lines are DEBUG
    progress = RunProgress(sink, cfg.train.steps, say=logger.info)
    try:
        before = evaluate_policy(cfg, servers.addresses, label="before", min_version=0, metrics=progress)
        preload_libraries()  # before the loops' threads import them concurrently (rollflow/data/preload.py)
        reporter.start()
        train_f = train_loop.submit(
            cfg, metrics=progress, stop_event=stop, pause_addresses=servers.addresses, timeline=timeline,
            report_progress=False,
        )  # fmt: skip
        rollout_f = rollout_loop.submit(
            cfg, servers.addresses, metrics=progress, stop_event=stop, fleet=servers, timeline=timeline,
            writer_name=writer_name_for(0),  # the trial's one worker: a resumed run adopts its open blocks
        )  # fmt: skip
        evals_f = eval_loop.submit(
            cfg,
            servers.addresses,
            metrics=progress,
            stop_event=stop,
            timeline=timeline,
            log_level=logging.DEBUG,
        )
        done = join_loops({"train-loop": train_f, "rollout-loop": rollout_f, "eval-loop": evals_f}, stop)
        train, rollout = done["train-loop"], done["rollout-loop"]
        figures = reporter.stop()
        timing = {"figures": figures, "bounds": bounds(figures), "doc": timeline.document()}
        logger.info("where the time went: %s", timing["bounds"])
        after = evaluate_policy(
            cfg, servers.addresses, label="after", min_version=int(train["final_version"]), metrics=sink
        )
    finally:
        stop.set()
        progress.close()
        reporter.stop()
        stop_servers(servers)
    return {"before": before, "after": after, "train": train, "rollout": rollout, "timing": timing}


@flow(
    name="async-rl",
    flow_run_name=async_rl_run_name,  # async-rl-<trial> from the first log line (flows/run_name.py)
    task_runner=ThreadPoolTaskRunner(max_workers=8),
    log_prints=True,
)
def async_rl(
    config: str | None = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    settings: ExperimentConfig | None = None,
    trial: str | None = None,
    resume: bool = False,
    retrain_from_registry: bool = False,
    auto_resume_of: str | None = None,
) -> dict[str, Any] | State:
    """Fully asynchronous GRPO/PPO: rollout and training concurrently, meeting only through storage.

    A deployment run whose failure a resume would only repeat ends Failed as ``NotResumable``, saying
    why; any other failure is resumed by the deployment's trigger (``flows/auto_resume.py``).

    Args:
        config: path of an experiment YAML (relative to the project dir); ignored when ``settings``
            is given.
        overrides: dotted overrides on top, e.g. ["train.steps=20", "rollout.max_staleness=0"].
        settings: the typed experiment config (the Prefect UI renders it as a form).
        trial: the trial to run; unset = a new trial named after the config's (every run is its
            own trial). ``{date}`` becomes today's date. A trial that already holds data needs
            ``resume``.
        resume: continue the named trial. A trial stopped after training gets the finalization it
            missed (tasks/finalize.py); a finished one is only reported: nothing is trained, logged
            or registered again.
        retrain_from_registry: start from the registered policy (the ``latest-rl`` alias) on a
            fresh data draw (the nightly retrain).
        auto_resume_of: the name of the crashed or failed ``async-rl-<trial>`` run this run resumes
            (set by the deployments' auto-resume trigger): implies its trial and ``resume``, and counts
            against ``orchestration.max_auto_resumes``.
    """
    try:
        return run_async_rl(config, overrides, settings, trial, resume, retrain_from_registry, auto_resume_of)
    except Exception as exc:
        state = not_resumable_state(exc)
        if state is None:
            raise
        return state


def run_async_rl(
    config: str | None = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    settings: ExperimentConfig | None = None,
    trial: str | None = None,
    resume: bool = False,
    retrain_from_registry: bool = False,
    auto_resume_of: str | None = None,
) -> dict[str, Any]:
    """The body of the ``async-rl`` flow; the arguments are the flow's (``async_rl``)."""

    configure_process_env()
    state_real_end_states()  # a cancelled run's last line says Cancelled, not Running() (flows/end_state.py)
    with core_logs_to_this_run():
        logger = get_run_logger()
        if auto_resume_of:
            trial, resume = begin_auto_resume(auto_resume_of), True
        overrides = list(overrides or [])
        cfg = resolve_config(config, overrides, data=config_data(settings))
        if cfg.orchestration.mode == "distributed":
            refuse_secret_overrides_for_other_processes("distributed mode's deployment runs")
        named = trial if trial is not None else (cfg.trial if named_in_overrides(overrides) else None)
        if named is None and not resume:  # the fresh trial the run's name announced
            named = planned_trial()
        plan = choose_trial(
            cfg.trial,
            named=named,
            resume=resume,
            open_storage=lambda t: open_trial_storage(cfg, t),
        )
        cfg = dataclasses.replace(cfg, trial=plan.trial)
        resumed = None
        if plan.state != "new":  # the trial's recorded config, not the YAML read again
            resumed = settle_config(
                open_trial_storage(cfg), cfg, state=plan.state, overrides=overrides, warn=logger.warning
            )
            cfg = resumed.cfg
        configure_process_env(cfg)
        name_flow_run(f"async-rl-{cfg.trial}")
        logger.info("trial %s (%s%s)", cfg.trial, plan.state, ", resume" if plan.resume else "")
        if plan.state == "finished":
            return _report_finished(cfg, plan.done or {}, logger)
        if plan.state == "trained":  # stopped between training and finalization: finish that, once
            return finalize_trained(
                cfg, plan.done or {}, logger, new_tags=resume_tags(resumed) if resumed else None
            )
        if auto_resume_of:
            charge_auto_resume(cfg, auto_resume_of, logger)
        source_version = None
        if retrain_from_registry and plan.state == "new":
            cfg, source_version = _from_registry(cfg, logger)
        if resumed is None:  # a new trial records the config it starts with (rollflow.trial_record)
            resumed = settle_config(open_trial_storage(cfg), cfg, state="new", overrides=overrides)
        t0 = time.monotonic()

        tracker: MlflowTracker | None = None
        if cfg.tracking.enabled:
            from rollflow.tracking.mlflow_tracker import MlflowTracker

            tracker = MlflowTracker(cfg)
            from rollflow.training.warm_start_reuse import warm_start_tags

            tracker.start(
                tags={**run_lineage(cfg, source_version), **resume_tags(resumed), **warm_start_tags(cfg)}
            )
            tracker.log_dataset_inputs()  # the train and eval sets as the run's MLflow dataset inputs
        storage = open_trial_storage(cfg)
        status = "FAILED"
        try:
            if cfg.orchestration.mode == "distributed":
                # The children run this trial (the resolved one, not a fresh one each) from the same settings.
                params = {
                    "config": config,
                    "overrides": [*overrides, *pinned_overrides(resumed), f"trial={cfg.trial}"],
                    "settings": settings,
                }
                parts = run_distributed(cfg, params, tracker)
            else:
                parts = _run_embedded(cfg, tracker, logger)
            summary: dict[str, Any] = {
                "experiment": cfg.experiment,
                "trial": cfg.trial,
                "final_version": int(parts["train"]["final_version"]),
                "eval_accuracy_before": parts["before"]["accuracy"],
                "eval_accuracy_after": parts["after"]["accuracy"],
                "train": {k: v for k, v in parts["train"].items() if not isinstance(v, (list, dict))},
                "rollout": {k: v for k, v in parts["rollout"].items() if not isinstance(v, (list, dict))},
                "storage_uri": storage.root_uri,
                "mlflow_run_id": tracker.run_id if tracker else None,
                "mlflow_run_url": tracker.run_url if tracker else "-",
                "mlflow_tracking_uri": tracker.tracking_uri if tracker else None,
                "source_model_version": source_version,
                "wall_s": time.monotonic() - t0,
                "time_bounds": parts.get("timing", {}).get("bounds"),
            }
            if tracker:
                summary.update(finish_tracking(cfg, tracker, parts, summary))
            publish_summary(summary)
            status = "FINISHED"
        except BaseException as exc:
            status = "KILLED" if is_interruption(exc) else "FAILED"
            raise
        finally:
            if tracker:
                tracker.finish(status)
        record_finalized(cfg, summary)  # last: the trial is whole (storage.finalization)
        return summary


def _report_finished(cfg: ExperimentConfig, done: dict[str, Any], logger: RunLogger) -> dict[str, Any]:
    """A resume of a finished trial: report what is recorded; train, log and register nothing."""
    run = None
    if cfg.tracking.enabled:
        from rollflow.tracking.mlflow_tracker import MlflowTracker

        run = MlflowTracker(cfg).find_run()
    final = int(done.get("version", 0))  # the trainer's DONE.json
    logger.info("trial %s already finished at version %d; nothing to do", cfg.trial, final)
    return {
        "experiment": cfg.experiment,
        "trial": cfg.trial,
        "already_finished": True,
        "final_version": final,
        "mlflow_run_id": run.info.run_id if run else None,
        "registered_model": (run.data.tags.get("rollflow.registry.version") if run else None),
    }


def _from_registry(cfg: ExperimentConfig, logger: RunLogger) -> tuple[ExperimentConfig, str]:
    """Nightly retrain: start from the registered policy (alias ``latest-rl``), on a fresh synthetic draw."""
    from rollflow.tracking.mlflow_tracker import MlflowTracker, download_latest_registered

    tracker = MlflowTracker(cfg)
    local, tags = download_latest_registered(
        tracker.tracking_uri, tracker.model_name, f"{cfg.storage.local_cache}/registry/{cfg.trial}"
    )
    source = tags["registry_version"]
    logger.info("retraining from registered %s v%s at %s", tracker.model_name, source, local)
    model = dataclasses.replace(cfg.model, path=str(local), bootstrap_tiny=False)
    dataset = cfg.dataset
    if dataset.kind == "synthetic":  # fresh data: a new draw of the synthetic task per retrain
        dataset = dataclasses.replace(
            dataset, synthetic=dataclasses.replace(dataset.synthetic, seed=int(time.strftime("%Y%m%d")))
        )
    return dataclasses.replace(cfg, model=model, dataset=dataset), source


def print_summary(summary: dict[str, Any]) -> None:
    if summary.get("already_finished"):
        print(
            f"trial {summary['trial']} had already finished at version {summary['final_version']}; nothing done"
        )
        return
    print()
    if summary.get("finalized_on_resume"):
        print(f"trial {summary['trial']} had trained to version {summary['final_version']}; finalized now")
    print(f"trial {summary['trial']}")
    print(f"eval_accuracy_before {summary['eval_accuracy_before']:.3f}")
    print(f"eval_accuracy_after {summary['eval_accuracy_after']:.3f}")
    print(f"final_version {summary['final_version']}  wall_s {summary['wall_s']:.0f}")
    if summary.get("time_bounds"):  # absent on a resume that only finalized
        print(f"time: {summary['time_bounds']}")
    print(f"registered: {summary.get('registered_model') or '-'} ({summary.get('registry_decision')})")
    print(f"storage: {summary['storage_uri']}")
    from flows.console import mlflow_lines

    print("\n".join(mlflow_lines(summary.get("mlflow_tracking_uri"), summary.get("mlflow_run_url"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the async-rl flow locally (a private Prefect API).")
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--trial", default=None, help="trial name (default: a new one)")
    parser.add_argument("--resume", action="store_true", help="continue the named trial")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20")
    args = parser.parse_args(argv)
    return run_command(
        args.config, args.overrides, trial=args.trial, resume=args.resume, verbose=args.verbose
    )


def run_command(
    config: str, overrides: list[str], *, trial: str | None, resume: bool, verbose: bool = False
) -> int:
    """Run the flow in this process (a private Prefect API unless ``PREFECT_API_URL`` is set) and print
    its summary; the console shows the run's milestones (``flows.console``; ``verbose``: every step too).
    Ctrl-C prints one line saying what was kept and how to resume (``flows.interrupt``); ``kill -USR1``
    of the process prints every thread's stack to stderr (a stuck run says where it is stuck)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from flows.console import run_console
    from flows.interrupt import INTERRUPTED_STATUS, kept_line, quiet_interrupt_logs, trial_for_command
    from flows.local_api import local_prefect_api
    from rollflow.configuration.parameter_secrets import secret_overrides_aside

    with secret_overrides_aside(overrides) as public:
        trial = trial_for_command(config, overrides, trial)
        try:
            with run_console(verbose=verbose), quiet_interrupt_logs(), local_prefect_api():
                summary = async_rl(config=config, overrides=public, trial=trial, resume=resume)
        except KeyboardInterrupt:
            print(kept_line(trial, config, overrides, shown=public), file=sys.stderr)
            return INTERRUPTED_STATUS
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
