"""``bench.peer`` on the user's path: the outside-built task ``bench/tasks/sub_gap`` (a model directory
rollflow did not build, a ``files`` dataset, a ``module:function`` reward), a few seconds per system; plus
the per-step figures on hand-made curves and the refusal to race a model that is not there.

As in test_peer.py, timings and learning are never asserted: the race checks that both systems trained
on the outside task, that the per-step snapshots were taken and scored, and that the keys are printed.
TRL's side is skipped (rollflow alone races) when its venv is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.peer import PER_STEP, TaskNotBuiltError, per_step_keys, start_model

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "bench/tasks/sub_gap/config.yaml"
HAS_TRL = (ROOT / ".venv-trl" / "bin" / "python").exists()


def _run(seed: int, step_acc: dict[int, float]) -> dict[str, Any]:
    return {"seed": seed, "step_acc": {str(k): v for k, v in step_acc.items()}}


def test_per_step_ratio_is_rollflows_median_over_trls_and_none_unless_every_run_got_there() -> None:
    trl = [_run(1, {500: 0.2, 1000: 0.4}), _run(2, {500: 0.3, 1000: 0.5}), _run(3, {500: 0.4})]
    rollflow = [
        _run(1, {500: 0.3, 1000: 0.6}),
        _run(2, {500: 0.6, 1000: 0.7}),
        _run(3, {500: 0.45, 1000: 0.8}),
    ]
    out = per_step_keys({"trl": trl, "rollflow": rollflow}, (500, 1000, 1500))
    # step 500: medians 0.45 / 0.3 = 1.5; per seed 0.3/0.2 = 1.5, 0.6/0.3 = 2.0, 0.45/0.4 = 1.125
    assert out["trl_acc_at_step_500"] == "0.300" and out["rollflow_acc_at_step_500"] == "0.450"
    assert out["per_step_acc_ratio_at_500"] == "1.500"
    assert out["per_step_acc_ratio_at_500_spread"] == "1.12..2"
    # step 1000: TRL's seed 3 stopped before it, so no ratio (its two seeds' median would be 0.45)
    assert out["trl_acc_at_step_1000"] == "0.450" and out["trl_acc_at_step_1000_spread"] == "0.4..0.5"
    assert out["per_step_acc_ratio_at_1000"] == "none"
    assert out["per_step_acc_ratio_at_1000_spread"] == "1.4..1.5"  # 0.6/0.4, 0.7/0.5
    # step 1500: nobody got there
    assert out["trl_acc_at_step_1500"] == out["rollflow_acc_at_step_1500"] == "none"
    assert out["per_step_acc_ratio_at_1500"] == "none"
    # TRL at 0 accuracy: no ratio rather than inf
    zero = per_step_keys({"trl": [_run(1, {500: 0.0})], "rollflow": [_run(1, {500: 0.2})]}, (500,))
    assert zero["per_step_acc_ratio_at_500"] == "none"
    # one system alone: its own figures, no ratio
    alone = per_step_keys({"rollflow": rollflow}, PER_STEP)
    assert alone["rollflow_acc_at_step_500"] == "0.450" and "per_step_acc_ratio_at_500" not in alone
    assert PER_STEP == (500, 1000, 1500)


def test_a_missing_model_without_a_make_task_beside_the_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskNotBuiltError, match="no make_task.py"):
        start_model(ROOT / "configs" / "tiny_cpu.yaml", tmp_path / "nowhere" / "model")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert start_model(ROOT / CONFIG, tmp_path / "m") == (tmp_path / "m").resolve()  # there: used as is


@pytest.mark.slow
def test_peer_races_the_outside_task_and_prints_the_per_step_keys(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.tasks.sub_gap import make_task

    task = tmp_path / "sub_gap"  # a tiny build: the test checks plumbing, not learning
    arch = {**make_task.ARCH, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    make_task.build(task, seed=0, steps=60, arch=arch, threads=1)
    systems = ["trl", "rollflow"] if HAS_TRL else ["rollflow"]
    cmd = [
        sys.executable, "-m", "bench.peer", "--config", CONFIG, "--seeds", "1", "--seconds", "6",
        "--sync-seconds", "0", "--snapshot-every", "3", "--snapshot-steps", "2", "500", "1000", "1500",
        "--systems", *systems, "--out", str(tmp_path / "out"),
        f"model.path={task / 'model'}",
        f"dataset.path=train={task / 'train.jsonl'},test={task / 'test.jsonl'}",
        "eval.n_prompts=16",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line and not line.startswith("#"))
    for system in systems:
        for n in (2, *PER_STEP):
            assert f"{system}_acc_at_step_{n}" in lines, f"{system} step {n} missing from:\n{proc.stdout}"
            assert f"{system}_acc_at_step_{n}_spread" in lines
        assert 0.0 <= float(lines[f"{system}_acc_at_step_2"]) <= 1.0  # step 2 is reached in 6 s
        assert lines[f"{system}_acc_at_step_1500"] == "none"  # and step 1500 is not
        assert f"{system}_acc_at_6s" in lines
    if HAS_TRL:
        for n in (2, *PER_STEP):
            assert f"per_step_acc_ratio_at_{n}" in lines and f"per_step_acc_ratio_at_{n}_spread" in lines
        assert lines["per_step_acc_ratio_at_500"] == "none"
        assert "completions_per_s_ratio" in lines and "time_to_trl_final_ratio" in lines
    doc = json.loads((tmp_path / "out" / "peer_sub_gap.json").read_text())
    assert {r["system"] for r in doc["runs"]} == set(systems)
    for run in doc["runs"]:
        assert run["steps"] >= 2, run["system"]
        assert "2" in run["step_acc"], run["system"]  # the step-2 snapshot was taken and scored
        assert run["step_acc"]["0"] == doc["base_acc"]
        assert run.get("reward_errors", 0) == 0  # TRL imported and called the task's reward
