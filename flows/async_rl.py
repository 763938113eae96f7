"""The main flow: fully asynchronous RL on one config.

Embedded mode (one machine): bootstrap the policy, start the inference servers, score the base
policy, then run the rollout loop, the train loop and the periodic evaluation concurrently; when the
trainer writes its done marker everything stops, the final policy is scored and registered in MLflow,
and a summary comes back (final version, accuracies, MLflow run id, storage URIs).
Distributed mode (``flows/distributed.py``): the same story, with the train loop and N rollout workers
as `train` and `rollout` deployment runs on their work pools, sharing the storage root and MLflow run.

A trial is whole once it is finalized (final evaluation, registry decision, MLflow run ended, then
FINALIZED.json: ``rollflow/trial/finalization.py``); resuming a trial stopped after training runs what it missed.

Run it:  python -m flows.async_rl --config configs/tiny_cpu.yaml train.steps=20    (-v: every step)
   or:   prefect deployment run 'async-rl/local' --param overrides='["train.steps=20"]'
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from flows.auto_resume import begin_auto_resume, charge_auto_resume, not_resumable_state
from flows.console import VERBOSE_HELP
from flows.distributed import run_distributed
from flows.embedded import run_embedded
from flows.end_state import state_real_end_states
from flows.run_name import async_rl_run_name, planned_trial
from rollflow.api.config import ExperimentConfig
from rollflow.configuration.parameter_secrets import refuse_secret_overrides_for_other_processes
from rollflow.trial.finalization import record_finalized
from rollflow.trial.opening import OpenTrial, open_trial
from rollflow.trial.summary import finished_report, run_summary
from tasks.finalize import finalize_trained, finish_tracking, publish_summary, start_tracking
from tasks.runtime import (
    config_data,
    configure_process_env,
    core_logs_to_this_run,
    is_interruption,
    name_flow_run,
    resolve_config,
)

if TYPE_CHECKING:
    from tasks.runtime import RunLogger

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"


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
            missed (rollflow/trial/finalization.py); a finished one is only reported: nothing is trained, logged
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
        opened = open_trial(  # its name, its state and the config it runs with (rollflow/trial/)
            cfg, trial, resume=resume, overrides=overrides, planned=planned_trial(),
            retrain_from_registry=retrain_from_registry, warn=logger.warning,
        )  # fmt: skip
        configure_process_env(opened.cfg)
        name_flow_run(f"async-rl-{opened.cfg.trial}")
        logger.info(opened.describe())
        if opened.state == "finished":
            return finished_report(opened.cfg, opened.done)
        if opened.state == "trained":  # stopped between training and finalization: finish that, once
            return finalize_trained(opened.cfg, opened.done, logger, new_tags=opened.tags)
        if auto_resume_of:
            charge_auto_resume(opened.cfg, auto_resume_of, logger)
        children = {"config": config, "overrides": overrides, "settings": settings}
        return _train_trial(opened, children, logger)


def _train_trial(opened: OpenTrial, children: dict[str, Any], logger: RunLogger) -> dict[str, Any]:
    """Train the opened trial, score it, log and register it, then record it finalized (last)."""
    cfg, t0 = opened.cfg, time.monotonic()
    tracker = start_tracking(opened)
    status = "FAILED"
    try:
        if cfg.orchestration.mode == "distributed":  # the children run this trial from the same settings
            pinned = [*children["overrides"], *opened.pinned_overrides, f"trial={cfg.trial}"]
            parts = run_distributed(cfg, {**children, "overrides": pinned}, tracker)
        else:
            parts = run_embedded(cfg, tracker, logger)
        summary = run_summary(
            cfg, parts, storage_uri=opened.storage().root_uri, tracker=tracker,
            source_version=opened.source_version, wall_s=time.monotonic() - t0,
        )  # fmt: skip
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
    record_finalized(cfg, summary)  # last: the trial is whole (rollflow/trial/finalization.py)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the async-rl flow locally (a private Prefect API).")
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--trial", default=None, help="trial name (default: a new one)")
    parser.add_argument("--resume", action="store_true", help="continue the named trial")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20")
    args = parser.parse_args(argv)
    from flows.cli.run import run_command

    return run_command(
        async_rl, args.config, args.overrides, trial=args.trial, resume=args.resume, verbose=args.verbose
    )


if __name__ == "__main__":
    sys.exit(main())
