"""A trial heals itself through Prefect: a real server, a process worker and the ``async-rl/local``
deployment of ``prefect.yaml`` (its auto-resume trigger). The flow-run process is SIGKILLed mid-training;
nobody calls resume, yet the trial finishes with storage clean (``bench.prompt_audit``), one MLflow run,
and the resume counted in the trial's budget. ``recovery_s`` (kill -> training again) is printed.
Three kills: ``python -m bench.auto_resume``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.auto_resume import run_auto_resume

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_killed_deployment_run_is_resumed_by_prefect_and_finishes_clean(
    prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    lines: list[str] = []
    figures, audit = run_auto_resume(dict(prefect_env), tmp_path, kills=1, steps=12, say=lines.append)
    report = "\n".join([*lines, *(f"{k} {v}" for k, v in figures.items()), *audit.problems])
    print(report)
    assert figures["final_state"] == "Completed", report
    assert figures["flow_runs"] == 2 and figures["auto_resumed"] == 1, report  # killed one + its resume
    assert figures["states"] == "Crashed,Completed", report
    assert figures["auto_resumes"] == 1, report  # counted in the trial's storage
    assert audit.ok and audit.positions_unaccounted == 0 and audit.groups_trained_twice == 0, report
    assert audit.final_committed and audit.final_version == 12, report
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-arith")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rollflow.trial` = 'autoheal'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", report  # continued, not duplicated
