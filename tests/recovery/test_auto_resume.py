"""A trial heals itself through Prefect: a real server, a process worker and the ``async-rl/local``
deployment of ``prefect.yaml`` (its auto-resume trigger). The flow-run process is SIGKILLed mid-training
three times (each life after it has trained a step); nobody calls resume, yet the trial finishes with
storage clean (``bench.prompt_audit``: nothing lost, nothing generated or trained twice), every trained
group within the staleness bound (``trainer/consumed/``), one MLflow run, and the three resumes counted
in the trial's budget (``orchestration.max_auto_resumes``, default 3). ``recovery_s`` (kill -> training
again) is printed for each kill. The same with its own server: ``python -m bench.auto_resume``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.auto_resume import run_auto_resume

KILLS = 3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_a_deployment_run_killed_three_times_is_resumed_by_prefect_and_finishes_clean(
    prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    lines: list[str] = []
    figures, audit = run_auto_resume(
        dict(prefect_env), tmp_path, kills=KILLS, steps=12, say=lines.append, timeout_s=1400
    )
    report = "\n".join([*lines, *(f"{k} {v}" for k, v in figures.items()), *audit.problems])
    print(report)
    assert figures["final_state"] == "Completed", report
    assert figures["flow_runs"] == KILLS + 1 and figures["auto_resumed"] == KILLS, (
        report
    )  # nobody else ran it
    assert figures["states"] == ",".join(["Crashed"] * KILLS + ["Completed"]), report
    assert figures["auto_resumes"] == KILLS, report  # counted in the trial's storage
    assert all(f"recovery_s_{i}" in figures for i in range(1, KILLS + 1)), report  # trained after each kill
    assert audit.ok and audit.positions_unaccounted == 0 and audit.groups_trained_twice == 0, report
    assert audit.positions_generated_twice == 0, report
    assert audit.final_committed and audit.final_version == 12, report
    assert figures["staleness_held"] and figures["staleness_max"] >= 0, report  # from trainer/consumed/
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny-arith")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rollflow.trial` = 'autoheal'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", report  # continued, not duplicated
