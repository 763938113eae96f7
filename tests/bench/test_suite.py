"""bench.suite: the candidate defaults reach every family whatever its config tuned; the table's numbers.

The table is checked on two hand-made families of two seeds each (numbers worked out by hand below);
the whole path (warm start, both systems, scoring) is the smoke run in bench/suite/run.py's docstring.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.peer_eval import mark_window, value_near
from bench.suite.families import FAMILIES, candidate_overrides, family_config, select
from bench.suite.report import table
from rollflow.configuration.loader import load_config


def test_the_split_is_fixed_and_has_at_least_four_reasoning_gym_families() -> None:
    rg = [f for f in FAMILIES.values() if f.task is not None]
    assert len(rg) >= 4 and {"add_gap", "sub_gap"} <= FAMILIES.keys()
    assert {f.name for f in select(["test"])} == {"chain_sum", "gcd", "products"}
    assert {"add_gap", "sub_gap"} <= {
        f.name for f in select(["dev"])
    }  # every default so far was tuned on them
    with pytest.raises(SystemExit, match="unknown family 'gdc'"):
        select(["gdc"])


def test_a_tuned_config_runs_at_the_candidate_defaults(tmp_path: Path) -> None:
    """configs/tiny_hard.yaml sets two passes, staleness 1 and the curriculum; the suite overrides them."""
    cfg = load_config(family_config(FAMILIES["add_gap"], tmp_path), candidate_overrides())
    assert (cfg.train.ppo_epochs, cfg.rollout.max_staleness, cfg.rollout.shard_flush_rows) == (1, 2, None)
    assert cfg.rollout.curriculum_probs() == (0.0, 0.0)
    gcd = load_config(family_config(FAMILIES["gcd"], tmp_path, size=30, eval_size=10), candidate_overrides())
    assert gcd.dataset.kind == "reasoning_gym" and gcd.dataset.reasoning_gym.params == {
        "min_value": 1,
        "max_value": 99,
    }


def _run(
    system: str, seed: int, curve: list[tuple[float, float]], solved: float, *, rate: float = 1.0
) -> dict:
    """A bench.peer run: a snapshot at each curve point but the start, ``rate`` optimizer steps a second."""
    return {
        "system": system,
        "seed": seed,
        "curve": curve,
        "retention": [(0.0, 1.0, 0.0), (curve[-1][0], solved, 0.5)],
        "snapshots": [{"t": t, "step": int(t * rate)} for t, _ in curve[1:]],
        "steps": int(curve[-1][0] * rate),
        "train_seconds": curve[-1][0],
    }


def test_the_table_reads_medians_at_each_time_and_compares_with_trl() -> None:
    # two seeds per system; the horizon is 60 s, the runs end a little past it (their final point counts)
    doc = {
        "base_acc": 0.25,
        "summary": {"time_to_trl_final_ratio": "0.5", "rollflow_completions_to_0.8": "none"},
        "runs": [
            _run("trl", 1, [(0.0, 0.25), (30.0, 0.3), (61.0, 0.5)], 0.9),
            _run("trl", 2, [(0.0, 0.25), (30.0, 0.4), (62.0, 0.6)], 0.7),
            _run("rollflow", 1, [(0.0, 0.25), (30.0, 0.2), (61.0, 0.7)], 0.8),
            _run("rollflow", 2, [(0.0, 0.25), (30.0, 0.6), (60.5, 0.5)], 1.0),
        ],
    }
    text, keys = table({"fam": doc}, {"fam": "test"}, [30.0, 60.0], 60.0)
    # at 30 s: trl (0.3, 0.4) -> 0.35, rollflow (0.2, 0.6) -> 0.4; at 60 s: trl (0.5, 0.6) -> 0.55,
    # rollflow (0.7, 0.5) -> 0.6; retention at 60 s: trl (0.9, 0.7) -> 0.8, rollflow (0.8, 1.0) -> 0.9
    assert keys["suite_fam_trl_acc_at_30s"] == "0.350" and keys["suite_fam_rollflow_acc_at_30s"] == "0.400"
    assert keys["suite_fam_trl_acc_at_60s"] == "0.550" and keys["suite_fam_rollflow_acc_at_60s"] == "0.600"
    assert keys["suite_fam_trl_retention"] == "0.800" and keys["suite_fam_rollflow_retention"] == "0.900"
    assert keys["suite_fam_rollflow_ge_trl_after_30s"] == "yes"  # only 60 s counts (after the first 30 s)
    assert keys["suite_fam_time_to_trl_final_ratio"] == "0.5" and "0.400 (0.20..0.60)" in text
    doc["runs"][3]["curve"][-1] = (60.5, 0.3)  # rollflow (0.7, 0.3) -> 0.5 < 0.55 at 60 s
    assert (
        table({"fam": doc}, {"fam": "test"}, [30.0, 60.0], 60.0)[1]["suite_fam_rollflow_ge_trl_after_30s"]
        == "no"
    )
    assert keys["suite_fam_rollflow_gain"] == "+0.350"  # 0.6 at the horizon against the base 0.25
    doc["runs"][0]["curve"][-1] = (61.0, 0.2)
    doc["runs"][1]["curve"][-1] = (62.0, 0.25)  # TRL ends at the base: reaching it says nothing
    assert (
        table({"fam": doc}, {"fam": "test"}, [30.0, 60.0], 60.0)[1]["suite_fam_time_to_trl_final_ratio"]
        == "n/a"
    )


def test_the_table_reads_each_mark_at_the_nearest_snapshot() -> None:
    """Snapshots land a little after their mark (TRL here) or a little before it (rollflow); each mark
    reads the run's snapshot nearest it, never the previous mark's (marks 30, 60, 90 s, horizon 90 s)."""
    doc = {
        "base_acc": 0.2,
        "summary": {},
        "runs": [
            _run("trl", 1, [(0.0, 0.2), (30.6, 0.4), (61.2, 0.6), (91.0, 0.8)], 0.9),  # late
            _run("trl", 2, [(0.0, 0.2), (31.0, 0.3), (60.5, 0.5), (90.4, 0.7)], 0.9),  # late
            _run("rollflow", 1, [(0.0, 0.2), (29.5, 0.5), (59.8, 0.7), (90.5, 0.9)], 0.9),  # early
            _run("rollflow", 2, [(0.0, 0.2), (29.9, 0.3), (59.0, 0.6), (90.2, 0.8)], 0.9),  # early
        ],
    }
    keys = table({"fam": doc}, {"fam": "test"}, [30.0, 60.0, 90.0], 90.0)[1]
    # trl at 30 s: 30.6 -> 0.4, 31.0 -> 0.3: median 0.35 (the last snapshot before 30 s is the 0 s score, 0.2);
    # at 60 s: 61.2 -> 0.6, 60.5 -> 0.5: 0.55 (not the 30 s scores' 0.35); at 90 s the final points: 0.75
    assert [keys[f"suite_fam_trl_acc_at_{t}s"] for t in (30, 60, 90)] == ["0.350", "0.550", "0.750"]
    # rollflow at 30 s: 29.5 -> 0.5, 29.9 -> 0.3: 0.4; at 60 s: 59.8 -> 0.7, 59.0 -> 0.6: 0.65; at 90 s: 0.85
    assert [keys[f"suite_fam_rollflow_acc_at_{t}s"] for t in (30, 60, 90)] == ["0.400", "0.650", "0.850"]


def test_nearest_snapshot_ties_go_earlier_and_none_is_read_from_too_far() -> None:
    assert mark_window([30.0, 60.0, 120.0, 180.0, 240.0]) == 15.0  # half of the smallest gap (0-30, 30-60)
    assert mark_window([100.0, 300.0]) == 50.0  # gaps 100 (from the start), 200
    curve = [(0.0, 0.1), (25.0, 0.2), (35.0, 0.3), (80.0, 0.4)]
    assert value_near(curve, 30.0, within=15.0) == 0.2  # 25 and 35 are both 5 s away: the earlier one
    assert value_near(curve, 34.0, within=15.0) == 0.3  # 35 is 1 s away, 25 is 9 s away
    assert math.isnan(value_near(curve, 60.0, within=15.0))  # nearest is 80 (20 s away) > 15
    assert value_near(curve, 60.0, within=15.0, final_from=60.0) == 0.4  # the final point past the horizon


def test_reachability_counts_the_unsolved_problems_a_group_can_learn_from() -> None:
    """reachable_unsolved: greedy-wrong rows that at least one sample solves; mixed: 0 < count < k."""
    from bench.suite.run import reachability

    correct = [True, True, False, False, False, False]
    counts = [8, 5, 0, 1, 0, 8]
    r = reachability(correct, counts, 8)
    assert r["reachable_unsolved"] == pytest.approx(2 / 4)
    assert r["mixed"] == pytest.approx(2 / 6)
    assert r["sample_acc"] == pytest.approx(22 / 48)
    with pytest.raises(ValueError):
        reachability([True], [1, 2], 8)


def test_calibration_marks_a_family_learnable_only_above_the_dev_bar(tmp_path: Path) -> None:
    """record_calibration keeps the reachable share and says whether it clears LEARNABLE_REACHABLE."""
    from bench.suite.families import LEARNABLE_REACHABLE
    from bench.suite.run import record_calibration

    out = tmp_path / "calibration.json"
    base = {"base_acc": 0.3, "base_solved": 60.0, "n_eval": 200.0, "mixed": 0.1, "sample_acc": 0.3}
    low = record_calibration(
        out, FAMILIES["gcd"], {**base, "reachable_unsolved": LEARNABLE_REACHABLE / 2}, []
    )
    assert low["in_range"] and not low["learnable"]
    high = record_calibration(
        out, FAMILIES["products"], {**base, "reachable_unsolved": LEARNABLE_REACHABLE}, []
    )
    assert high["learnable"] and high["warm_start_steps"] == FAMILIES["products"].warm_start_steps
    assert set(json.loads(out.read_text())) == {"gcd", "products"}


def test_both_systems_are_read_at_trls_step_count() -> None:
    """per_step: kept and learnt at TRL's median final step (rounded down to 10), each run at its snapshot
    nearest it; rollflow, twice as fast, is read mid-run, not at its horizon."""
    from bench.suite.report import per_step

    def run(system: str, rate: float, kept: list[float]) -> dict:
        r = _run(system, 1, [(0.0, 0.2), (50.0, 0.3), (100.0, 0.4)], kept[-1], rate=rate)
        r["retention"] = [(0.0, 1.0, 0.0), (50.0, kept[0], 0.1), (100.0, kept[1], 0.2)]
        return r

    doc = {"runs": [run("trl", 1.03, [0.9, 0.8]), run("trl", 1.05, [0.8, 0.7]),
                    run("rollflow", 2.0, [0.85, 0.6]), run("rollflow", 2.0, [0.75, 0.5])]}  # fmt: skip
    keys = per_step("fam", doc)
    # TRL ends at steps 103 and 105: median 104 -> mark 100; TRL reads its 100 s snapshots (steps 103, 105),
    # rollflow its 50 s ones (step 100), not its last (step 200)
    assert keys["suite_fam_trl_kept_at_step_100"] == "0.750 (0.70..0.80)"
    assert keys["suite_fam_rollflow_kept_at_step_100"] == "0.800 (0.75..0.85)"
    assert keys["suite_fam_rollflow_learnt_at_step_100"] == "0.100 (0.10..0.10)"
    assert keys["suite_fam_rollflow_steps_per_s"] == "2.000"
