"""The peer harness end to end, a few seconds per system: TRL and rollflow both run and leave curves.

Timings are never asserted (the harness's figures come from ``make bench-peer``); what is checked is
that each system trained, that every snapshot was scored by the shared scorer, and that the printed
``key value`` lines and the JSON / PNG files are there and consistent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollflow.configuration.loader import load_config

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    not (ROOT / ".venv-trl" / "bin" / "python").exists(), reason="TRL's venv is missing: `make trl-venv`"
)
def test_peer_harness_runs_both_systems_and_writes_curves(tmp_path: Path) -> None:
    small = [  # a small, quickly warm-started model: the test checks plumbing, not learning
        "model.tiny.hidden_size=32",
        "model.tiny.num_layers=1",
        "model.tiny.warm_start_steps=30",
        "eval.n_prompts=16",
    ]
    cmd = [
        sys.executable, "-m", "bench.peer", "--config", "configs/tiny_cpu.yaml", "--seeds", "1",
        "--seconds", "6", "--sync-seconds", "4", "--snapshot-every", "3", "--out", str(tmp_path), *small,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line and not line.startswith("#"))
    for key in (
        "trl_completions_per_s",
        "rollflow_completions_per_s",
        "completions_per_s_ratio",
        "trl_acc_at_6s",
        "rollflow_acc_at_6s",
        "time_to_trl_final_ratio",
        "rollflow_time_to_0.8",
        "async_vs_sync_step_ratio",
        "rollflow_core_busy_min",  # where the time went (rollflow.timing), for both rollflow systems
        "rollflow_trainer_waiting_data_frac",
        "rollflow-sync_rollout_capacity_wait_frac",
    ):
        assert key in lines, f"{key} missing from:\n{proc.stdout}"
    assert 0.0 <= float(lines["rollflow_core_busy_min"]) <= 1.0
    assert "# rollflow time (seed 1): trainer computing" in proc.stdout
    doc = json.loads((tmp_path / "peer_tiny_cpu.json").read_text())
    assert (tmp_path / "peer_tiny_cpu.png").stat().st_size > 1000
    systems = {r["system"]: r for r in doc["runs"]}
    epochs = load_config("configs/tiny_cpu.yaml").train.ppo_epochs
    assert set(systems) == {"trl", "rollflow", "rollflow-sync"}
    for name, run in systems.items():
        assert run["steps"] >= 1, name
        curve = run["curve"]
        assert curve[0] == [0.0, doc["base_acc"]]  # every curve starts at the shared base score
        assert len(curve) >= 2 and all(0.0 <= acc <= 1.0 for _, acc in curve), name
        assert [t for t, _ in curve] == sorted(t for t, _ in curve)
        assert curve[-1][0] >= 4.0  # the run went on to its budget (4 s sync, 6 s otherwise)
        # 16 prompts x 8 samples a batch; TRL counts each of its num_iterations (= train.ppo_epochs)
        # updates on a batch as a step, rollflow the whole batch
        batches = run["steps"] // epochs if name == "trl" else run["steps"]
        assert run["completions"] >= batches * 16 * 8, name
    assert float(lines["trl_completions_per_s"]) > 0 and float(lines["rollflow_completions_per_s"]) > 0


def test_per_token_keys_count_generation_to_the_threshold_and_the_lowest_accuracy_after_it() -> None:
    from bench.peer import per_token_keys

    def run(curve: list[tuple[float, float]], step_acc: dict[str, float]) -> dict:
        return {"curve": curve, "step_acc": step_acc, "completions": 12_800, "steps": 100}

    reached = run([(0, 0.2), (15, 0.85), (30, 0.5), (45, 0.9)], {"0": 0.2, "50": 0.85, "100": 0.9})
    never = run([(0, 0.2), (15, 0.7)], {"0": 0.2, "100": 0.7})
    keys = per_token_keys({"rollflow": [reached, never]})
    assert keys["rollflow_completions_to_0.8"] == "6400.000"  # step 50 x 128 completions per step
    assert keys["rollflow_runs_reaching_0.8"] == "1/2"
    assert keys["rollflow_min_acc_after_0.8"] == "0.500"  # the dip after first reaching 0.8
    assert "trl_min_acc_after_0.8" not in keys
