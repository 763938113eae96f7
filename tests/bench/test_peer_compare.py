"""bench.peer_compare: per-arm medians at the optimizer steps every run reached, and B's gain over A."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.peer_compare import main


def _write(folder: Path, accs: dict[int, float], completions: float = 12_800.0) -> None:
    folder.mkdir(parents=True)
    run = {
        "system": "rollflow",
        "seed": 1,
        "steps": 100,
        "completions": completions,
        "completions_per_s": 500.0,
        "step_acc": {str(k): v for k, v in accs.items()},
        "curve": [[10.0, accs[max(accs)]]],
    }
    trl = {**run, "system": "trl"}  # another system in the same file is not an arm's run
    (folder / "peer_x.json").write_text(json.dumps({"runs": [run, trl]}))


def test_arms_compare_at_common_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "a1", {50: 0.2, 100: 0.4})
    _write(tmp_path / "a2", {50: 0.3, 100: 0.6, 150: 0.9})
    _write(tmp_path / "b1", {50: 0.5, 100: 0.9})
    rc = main(["--a", "off", str(tmp_path / "a1"), str(tmp_path / "a2"), "--b", "on", str(tmp_path / "b1")])
    assert rc == 0
    keys = dict(line.split(" ", 1) for line in capsys.readouterr().out.splitlines())
    assert keys["off_runs"] == "2" and keys["on_runs"] == "1"
    assert keys["off_acc_at_step_100"] == "0.500" and keys["off_acc_at_step_100_spread"] == "0.4..0.6"
    assert keys["acc_gain_at_step_50"] == "+0.250"  # 0.5 - median(0.2, 0.3)
    assert "off_acc_at_step_150" not in keys  # not every run reached step 150
    # 0.8 first reached at step 100 of 100 steps x 12.8k completions: 12.8k; arm A: only one run got there
    assert keys["on_completions_to_0.8"] == "12800" and keys["off_runs_reaching_0.8"] == "1/2"


def test_no_runs_is_an_error(tmp_path: Path) -> None:
    assert main(["--a", "x", str(tmp_path), "--b", "y", str(tmp_path)]) == 2
