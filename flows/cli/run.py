"""A command-line run of the ``async-rl`` flow in this process, and what the console shows of it.

What it is: ``run_command`` (the flow under a private Prefect API unless ``PREFECT_API_URL`` is set, the
console's milestones, Ctrl-C's one line) and ``print_summary``; ``rollflow run``/``resume`` and
``python -m flows.async_rl`` call it. What it is not: the flow (``flows/async_rl.py``) or the command's
check of its trial (``rollflow.trial.preflight``).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from collections.abc import Callable
from typing import Any


def run_command(
    flow: Callable[..., dict[str, Any]],
    config: str,
    overrides: list[str],
    *,
    trial: str | None,
    resume: bool,
    verbose: bool = False,
) -> int:
    """Run the ``async-rl`` ``flow`` in this process (a private Prefect API unless ``PREFECT_API_URL`` is set) and print
    its summary; the console shows the run's milestones (``flows.console``; ``verbose``: every step too).
    Ctrl-C prints one line saying what was kept and how to resume (``flows.cli.interrupt``); ``kill -USR1``
    of the process prints every thread's stack to stderr (a stuck run says where it is stuck)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    from flows.cli.interrupt import INTERRUPTED_STATUS, quiet_interrupt_logs
    from flows.console import run_console
    from flows.local_api import local_prefect_api
    from rollflow.configuration.parameter_secrets import secret_overrides_aside
    from rollflow.trial.kept import kept_line, trial_for_command

    with secret_overrides_aside(overrides) as public:
        trial = trial_for_command(config, overrides, trial)
        try:
            with run_console(verbose=verbose), quiet_interrupt_logs(), local_prefect_api():
                summary = flow(config=config, overrides=public, trial=trial, resume=resume)
        except KeyboardInterrupt:
            print(kept_line(trial, config, overrides, shown=public), file=sys.stderr)
            return INTERRUPTED_STATUS
    print_summary(summary)
    return 0


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
