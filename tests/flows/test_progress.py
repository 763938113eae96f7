"""RunProgress (tasks/progress.py): a line and an artifact move per 10 % of training, never per step; a bar
only on a terminal; every metric still reaches the sink behind it."""

from __future__ import annotations

import io
import logging

from tasks.progress import RunProgress


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int | None]] = []

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((metrics, step))


def _step(p: RunProgress, v: int, reward: float = 0.5, staleness: float = 1.0, seqs: float = 16.0) -> None:
    metrics = {"train/version": float(v), "train/reward_mean": reward, "train/staleness_mean": staleness}
    p.log({**metrics, "train/seqs": seqs}, step=v)


def test_a_line_and_an_artifact_move_per_ten_percent_only() -> None:
    said: list[str] = []
    shown: list[float] = []
    inner = _Recorder()
    ticks = iter(range(0, 1000))
    p = RunProgress(
        inner, 100, say=said.append, publish=shown.append, bar_stream=None, clock=lambda: next(ticks)
    )
    for v in range(1, 101):
        _step(p, v)
    assert len(inner.calls) == 100  # every metric went on to MLflow
    assert shown == [1.0] + [float(x) for x in range(10, 101, 10)]  # created at the first step, then moved
    assert [line.split(":")[0] for line in said] == [f"progress {v}/100 ({v}%)" for v in range(10, 101, 10)]


def test_the_line_says_reward_accuracy_rate_and_staleness_since_the_previous_line() -> None:
    said: list[str] = []
    now = [0.0]
    p = RunProgress(None, 4, say=said.append, publish=lambda _: None, bar_stream=None, clock=lambda: now[0])
    p.log({"eval/accuracy": 0.21}, step=0)  # the "before" score
    now[0] = 2.0
    _step(p, 1, reward=0.25, staleness=1.0, seqs=16)  # 25 %: the first line, 16 completions in 2 s
    assert said == [
        "progress 1/4 (25%): reward 0.250, held-out accuracy 0.210 (v0), 8 completions/s, staleness 1.0, 2 s"
    ]
    p.log({"rollout/completions_per_s": 123.4, "rollout/version": 1.0}, step=1)  # not a train step
    now[0] = 6.0
    _step(p, 2, reward=0.5, staleness=2.0, seqs=32)  # 32 in the 4 s since the previous line
    assert said[-1] == (
        "progress 2/4 (50%): reward 0.500, held-out accuracy 0.210 (v0), 8 completions/s, staleness 2.0, 6 s"
    )
    p.log({"eval/accuracy": 0.6}, step=2)
    _step(p, 3, reward=1.0, staleness=0.0)
    _step(p, 4, reward=0.5, staleness=3.0)
    # each line averages the steps since the one before: (1.0) then (0.5); the accuracy is the newest
    assert said[2].startswith("progress 3/4 (75%): reward 1.000, held-out accuracy 0.600 (v2)")
    assert said[3].startswith("progress 4/4 (100%): reward 0.500") and "staleness 3.0" in said[3]
    assert "completions/s" not in said[3]  # no time passed on this clock: no rate rather than a wrong one


def test_a_resumed_run_says_where_it_is_then_goes_on_by_ten_percent() -> None:
    said: list[str] = []
    p = RunProgress(None, 100, say=said.append, publish=lambda _: None, bar_stream=None)
    for v in range(51, 71):
        _step(p, v)
    assert [line.split(":")[0] for line in said] == [
        "progress 51/100 (51%)",
        "progress 60/100 (60%)",
        "progress 70/100 (70%)",
    ]


def test_metrics_without_a_train_step_and_a_failing_artifact_never_stop_training() -> None:
    def broken(_: float) -> None:
        raise RuntimeError("no API")

    said: list[str] = []
    p = RunProgress(None, 2, say=said.append, publish=broken, bar_stream=None)
    p.log({"time/trainer/computing_frac": 0.5}, step=1)  # the timing reporter: not a step
    p.log({"x": 1.0})
    assert said == []
    _step(p, 1)
    _step(p, 2)
    assert len(said) == 2


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_moves_on_a_terminal_and_log_records_clear_it_first() -> None:
    term = _Terminal()
    handler = logging.StreamHandler(io.StringIO())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        p = RunProgress(None, 10, say=lambda _: None, publish=lambda _: None, bar_stream=term)
        assert any(f.__class__.__name__ == "_ClearBarFirst" for f in handler.filters)
        for v in range(1, 11):
            _step(p, v, reward=0.75)
        assert "10/10" in term.getvalue() and "reward 0.75" in term.getvalue()
        p.close()
        p.close()  # idempotent
        assert not handler.filters  # the console is as it was
    finally:
        root.removeHandler(handler)
    # not a terminal: no bar at all
    plain = io.StringIO()
    q = RunProgress(None, 10, say=lambda _: None, publish=lambda _: None, bar_stream=plain)
    _step(q, 5)
    q.close()
    assert plain.getvalue() == ""
