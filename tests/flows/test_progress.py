"""ProgressSink moves the progress artifact at milestones only (what `--watch` prints), never per step."""

from __future__ import annotations

from rollflow.api.metrics import NullSink
from tasks.tracking import ProgressSink


def test_progress_publishes_at_ten_percent_milestones() -> None:
    shown: list[float] = []
    sink = ProgressSink(NullSink(), total_steps=100, publish=shown.append)
    for step in range(1, 101):
        sink.log({"loss": 1.0}, step=step)
    assert shown == [1.0] + [float(p) for p in range(10, 101, 10)]  # the first step creates it


def test_progress_reaches_the_end_of_a_short_run_and_skips_unstepped_logs() -> None:
    shown: list[float] = []
    sink = ProgressSink(NullSink(), total_steps=3, publish=shown.append)
    sink.log({"x": 0.0})  # no step: nothing to show
    for step in (1, 2, 3, 3):
        sink.log({"loss": 1.0}, step=step)
    assert shown == [100 / 3, 200 / 3, 100.0]  # each step of a 3-step run crosses a 10 % boundary
