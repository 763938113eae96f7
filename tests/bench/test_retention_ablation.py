"""``bench.retention_ablation``: it refuses a test family, and reads retention at optimizer steps from the
runs ``bench.peer`` wrote (the start counts as step 0 even where a run lists no snapshot there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.retention_ablation import main, report


def _run(system: str, seed: int, solved: list[float]) -> dict[str, object]:
    times = [0.0, 15.0, 30.0]
    return {
        "system": system, "seed": seed, "steps": 200, "train_seconds": 30.0, "completions_per_s": 100.0 + seed,
        "snapshots": [{"t": 15.2, "step": 100}, {"t": 30.1, "step": 200}],  # none at 0, as rollflow's runs
        "retention": [[t, s, 0.1 * i] for i, (t, s) in enumerate(zip(times, solved, strict=True))],
        "curve": [[t, 0.2] for t in times], "timing": {"time/cpu/busy_frac_min": 0.7 + 0.1 * seed},
    }  # fmt: skip


def test_it_reads_retention_at_steps_and_the_horizon(tmp_path: Path) -> None:
    out = tmp_path / "rollflow" / "add_gap"
    out.mkdir(parents=True)
    runs = [_run("rollflow", 1, [1.0, 0.8, 0.6]), _run("rollflow", 2, [1.0, 0.9, 0.7])]
    (out / "peer_tiny_hard.json").write_text(json.dumps({"runs": runs}))
    keys = report(tmp_path, "add_gap", [100, 200])
    assert keys["rollflow_solved_at_step_100"].startswith("0.850 (0.8..0.9) n=2")
    assert keys["rollflow_solved_at_30s"].startswith("0.650")
    assert keys["rollflow_unsolved_at_step_200"].startswith("0.200")
    assert keys["rollflow_core_min"].startswith("0.85")
    assert "trl_steps" not in keys  # an arm that has not run is not reported


def test_a_test_family_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--family", "gcd", "--report-only"])
    assert "must be a dev family" in capsys.readouterr().err
