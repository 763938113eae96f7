"""The progress line shows retention while a run trains: the newest evaluation's accuracy on the held-out
problems the starting policy solved and on those it did not (tasks/progress.py)."""

from __future__ import annotations

from tasks.progress import RunProgress


def test_the_line_shows_base_solved_and_base_unsolved_accuracy() -> None:
    said: list[str] = []
    p = RunProgress(None, 2, say=said.append, publish=lambda _: None, bar_stream=None, clock=lambda: 0.0)
    p.log(
        {"eval/accuracy": 0.25, "eval/accuracy_base_solved": 1.0, "eval/accuracy_base_unsolved": 0.0}, step=0
    )
    p.log(
        {"eval/accuracy": 0.5, "eval/accuracy_base_solved": 0.6, "eval/accuracy_base_unsolved": 0.475}, step=1
    )
    p.log({"train/version": 1.0, "train/reward_mean": 0.5}, step=1)
    assert said == [
        "progress 1/2 (50%): reward 0.500, held-out accuracy 0.500 (v1; base-solved 0.600, base-unsolved 0.475), 0 s"
    ]
    p.log({"eval/accuracy": 0.7}, step=2)  # an evaluation without a split: no stale retention figures
    p.log({"train/version": 2.0, "train/reward_mean": 0.5}, step=2)
    assert said[-1] == "progress 2/2 (100%): reward 0.500, held-out accuracy 0.700 (v2), 0 s"
