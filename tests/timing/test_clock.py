"""RoleClock / Timeline: states add up to the wall time, spans merge and stay bounded, the document."""

from __future__ import annotations

import pytest

from rollflow.clock.roles import RoleClock, Timeline, UnknownStateError


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_states_add_up_to_the_wall_time_and_spans_record_each_switch() -> None:
    clock = FakeClock()
    tl = Timeline(clock=clock)
    trainer = tl.role("trainer", initial="other")
    clock.t += 1.0
    trainer.enter("waiting_data")
    clock.t += 3.0
    trainer.enter("computing")
    clock.t += 2.0
    trainer.enter("computing")  # no change: no new span
    clock.t += 2.0
    with trainer.during("publishing"):
        clock.t += 0.5
    assert trainer.state == "computing"
    clock.t += 1.5
    totals = trainer.totals()
    assert totals == {"waiting_data": 3.0, "computing": 5.5, "publishing": 0.5, "other": 1.0}
    assert sum(totals.values()) == pytest.approx(trainer.wall_s()) == pytest.approx(10.0)
    assert trainer.fractions()["computing"] == pytest.approx(0.55)
    assert [s for _, _, s in trainer.spans()] == [
        "other",
        "waiting_data",
        "computing",
        "publishing",
        "computing",
    ]
    assert trainer.spans()[1] == (1.0, 4.0, "waiting_data")
    assert trainer.spans()[-1][1] == pytest.approx(10.0)  # the open span ends now


def test_unknown_states_and_roles_are_named_errors() -> None:
    tl = Timeline()
    with pytest.raises(UnknownStateError, match="role 'trainer' has no state 'napping'"):
        tl.role("trainer").enter("napping")
    with pytest.raises(UnknownStateError, match="no declared states"):
        tl.role("mystery")
    assert tl.role("custom", ["a", "b"], initial="a").state == "a"
    with pytest.raises(UnknownStateError, match="initial state"):
        RoleClock("r", ["a"], initial="b", origin=0.0)


def test_spans_are_capped_but_totals_keep_growing() -> None:
    clock = FakeClock()
    tl = Timeline(clock=clock, max_spans=4)
    eval_clock = tl.role("eval")
    for _ in range(10):
        clock.t += 1.0
        eval_clock.enter("evaluating")
        clock.t += 1.0
        eval_clock.enter("idle")
    assert len(eval_clock.spans()) == 4 and eval_clock.truncated
    assert sum(eval_clock.totals().values()) == pytest.approx(20.0)
    assert eval_clock.totals()["evaluating"] == pytest.approx(10.0)


def test_metrics_and_document_carry_roles_versions_and_samples() -> None:
    clock = FakeClock()
    tl = Timeline(clock=clock)
    rollout = tl.role("rollout", initial="idle")
    tl.mark_version(0)
    clock.t += 2.0
    rollout.enter("generating")
    tl.mark_version(1)
    tl.mark_version(1)  # repeated: one mark
    clock.t += 2.0
    tl.add_sample({"t": tl.now(), "cores": {"0": 0.5}})
    m = tl.metrics()
    assert m["time/rollout/generating_frac"] == pytest.approx(0.5)
    assert m["time/rollout/idle_frac"] == pytest.approx(0.5)
    assert m["time/rollout/wall_s"] == pytest.approx(4.0)
    doc = tl.document()
    assert doc["versions"] == [[0.0, 0], [2.0, 1]] and tl.version == 1
    assert doc["roles"]["rollout"]["spans"] == [[0.0, 2.0, "idle"], [2.0, 4.0, "generating"]]
    assert doc["samples"] == [{"t": 4.0, "cores": {"0": 0.5}}]
