"""CoreMeter / ProcessMeter on /proc, the server counters' arithmetic, the reporter, the bounds line, the picture.

ServerMeter against a real CPU server: tests/rollout/test_server_meter.py (where the server fixture lives)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rollflow.inference.server_meter import engine_counters, interval_figures
from rollflow.timing.cpu import CoreMeter, ProcessMeter, process_cpu_s, read_core_jiffies
from rollflow.timing.report import TimingReporter, bounds

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 300 50 0 0 0 0 0
cpu1 200 0 50 300 0 0 0 0 0 0
intr 1 2 3
"""


def test_core_jiffies_count_iowait_as_idle(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text(STAT)
    assert read_core_jiffies(path) == {0: (150, 500), 1: (250, 550)}
    assert read_core_jiffies(tmp_path / "missing") == {}


def test_core_meter_shares_between_readings(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text(STAT)
    meter = CoreMeter(path)
    meter.cores = [0, 1]
    meter._first = meter._last = meter._read()
    # core 0: +90 busy of +100; core 1: +10 busy of +100
    path.write_text(
        STAT.replace("cpu0 100 0 50 300", "cpu0 190 0 50 310").replace(
            "cpu1 200 0 50 300", "cpu1 210 0 50 390"
        )
    )
    assert meter.sample() == pytest.approx({0: 0.9, 1: 0.1})
    assert meter.since_start() == pytest.approx({0: 0.9, 1: 0.1})
    assert meter.sample() == {}  # nothing elapsed since the last reading


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_meter_sees_this_process_burn_cpu() -> None:
    before = process_cpu_s(os.getpid())
    meter = ProcessMeter({"me": os.getpid(), "gone": 2**22 + 12345})
    t = time.monotonic()
    while time.monotonic() - t < 0.3:
        sum(i * i for i in range(1000))
    got = meter.sample()
    assert before is not None and "gone" not in got
    assert 0.3 < got["me"] <= 1.5  # about one core


def test_engine_counters_and_interval_figures() -> None:
    info = {
        "max_running_requests": 64,
        "internal_states": [{"busy_s": 1.0, "uptime_s": 10.0, "decode_steps": 10, "decode_seqs_total": 320}],
    }
    a = engine_counters(info)
    b = {**a, "busy_s": 4.0, "uptime_s": 14.0, "decode_steps": 20.0, "decode_seqs_total": 960.0}
    assert interval_figures(a, b) == pytest.approx({"busy_frac": 0.75, "avg_batch": 64.0, "occupancy": 1.0})
    assert engine_counters({"internal_states": [{"busy_s": True}]}) == {}  # no bools, no missing keys
    assert interval_figures({}, {}) == {}


def test_reporter_logs_time_metrics_and_bounds_names_the_waiting_side() -> None:
    from rollflow.api.metrics import InMemorySink
    from rollflow.clock.roles import Timeline

    tl = Timeline()
    tl.role("trainer", initial="waiting_data")
    tl.role("rollout", initial="generating")
    sink = InMemorySink()
    reporter = TimingReporter(tl, sink, pids={"me": os.getpid()}, interval_s=0.05).start()
    time.sleep(0.3)
    final = reporter.stop()
    assert reporter.stop() is final  # idempotent
    assert sink.values("time/trainer/waiting_data_frac")[-1] == pytest.approx(1.0)
    assert "time/cpu/busy_frac_min" in final and len(tl.document()["samples"]) >= 2
    line = bounds(final)
    assert "waiting for data 100%" in line and "generation bounds the run" in line
    line = bounds({"time/trainer/waiting_data_frac": 0.02, "time/trainer/computing_frac": 0.9,
                   "time/rollout/generating_frac": 0.3, "time/rollout/capacity_wait_frac": 0.6})  # fmt: skip
    assert "training bounds the run" in line


def test_plot_timeline_writes_a_png(tmp_path: Path) -> None:
    from rollflow.clock.roles import Timeline
    from rollflow.timing.plot import plot_timeline

    tl = Timeline()
    tr = tl.role("trainer", initial="other")
    for v in range(5):
        tr.enter("computing")
        tr.enter("waiting_data")
        tl.mark_version(v)
    tl.add_sample({"t": 0.1, "cores": {"0": 0.5, "1": 0.9}, "servers": {"a": {"busy_frac": 0.4}}})
    tl.add_sample({"t": 0.2, "cores": {"0": 0.6, "1": 0.8}, "servers": {"a": {"busy_frac": 0.5}}})
    out = plot_timeline(tl.document(), tmp_path / "sub" / "timeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_timeline_leaves_the_pyplot_backend_alone(tmp_path: Path) -> None:
    """The flow draws the timeline inside a notebook kernel: switching pyplot to Agg broke inline plots."""
    import matplotlib
    import matplotlib.pyplot as plt

    from rollflow.clock.roles import Timeline
    from rollflow.timing.plot import plot_timeline

    before = matplotlib.get_backend()
    plt.switch_backend("svg")
    try:
        tl = Timeline()
        tl.role("eval")
        plot_timeline(tl.document(), tmp_path / "t.png")
        assert matplotlib.get_backend() == "svg"
    finally:
        plt.switch_backend(before)
