"""bench.peer reports retention: accuracy on the held-out problems the starting model solved and on those
it did not (``bench.peer_eval.base_split_accuracies``, ``bench.peer.summarize``), numbers by hand."""

from __future__ import annotations

import math

import pytest

from bench.peer import summarize
from bench.peer_eval import base_split_accuracies


def test_base_split_accuracies() -> None:
    base = [True, True, False, False, False]
    # solved at the start: rows 0, 1 -> now 1 of 2 right = 0.5; unsolved: rows 2..4 -> 2 of 3 right
    assert base_split_accuracies([False, True, True, True, False], base) == (0.5, pytest.approx(2 / 3))
    solved, unsolved = base_split_accuracies([True, False], [False, False])
    assert math.isnan(solved) and unsolved == 0.5
    with pytest.raises(ValueError, match="not the same held-out rows"):
        base_split_accuracies([True], base)


def test_summary_prints_retention_at_the_horizon() -> None:
    def run(seed: int, solved: float, unsolved: float) -> dict:
        return {
            "system": "rollflow", "seed": seed, "completions_per_s": 100.0, "train_seconds": 10.0, "steps": 10,
            "curve": [(0.0, 0.25), (10.0, 0.5)], "step_acc": {"0": 0.25, "10": 0.5},
            "retention": [(0.0, 1.0, 0.0), (5.0, 0.9, 0.2), (10.0, solved, unsolved)],
        }  # fmt: skip

    out = summarize([run(1, 0.6, 0.4), run(2, 0.8, 0.5), run(3, 0.7, 0.6)], 10.0)
    assert out["rollflow_acc_base_solved_at_10s"] == "0.700"  # median of 0.6, 0.8, 0.7
    assert out["rollflow_acc_base_unsolved_at_10s"] == "0.500"
