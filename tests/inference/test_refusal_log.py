"""``RefusalLog`` / ``OncePerClientFilter``: one line per client per window, on a hand-driven clock."""

from __future__ import annotations

import logging

import pytest

from rollflow.inference.refusal_log import OncePerClientFilter, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_one_line_per_client_per_window_then_the_count_of_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RefusalLog(logging.getLogger("refusal-test"), window_s=60.0, max_clients=2, clock=clock)
    with caplog.at_level(logging.WARNING, logger="refusal-test"):
        assert log.refused("a", "bad 1")  # t = 1000: logged
        assert not log.refused("a", "bad 2")  # t = 1000: held back (1)
        clock.t += 59.9
        assert not log.refused("a", "bad 3")  # t = 1059.9 < 1000 + 60: held back (2)
        assert log.refused("b", "other client")  # another client has its own window
        clock.t += 0.1
        assert log.refused("a", "bad 4")  # t = 1060: a new window; reports the 2 held back
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused a request from a: bad 1",
        "refused a request from b: other client",
        "refused a request from a: bad 4 (2 more refusals of this client in the last 60 s not logged)",
    ]
    # at most 2 clients remembered, the one logged longest ago forgotten first: order b (1059.9), a (1060)
    assert log.refused("c", "x")  # remembered: a, c; "b" is forgotten
    assert log.refused("b", "y")  # so "b" is logged again at once (and "a" is forgotten)
    assert not log.refused("c", "again")  # "c" is still inside its window


def test_the_filter_passes_a_record_once_per_peer_per_window() -> None:
    clock = Clock()
    f = OncePerClientFilter(window_s=60.0, clock=clock)

    def record(peer: str) -> logging.LogRecord:
        return logging.LogRecord(
            "aiohttp", logging.ERROR, __file__, 1, "Error handling request from %s", (peer,), None
        )

    assert [f.filter(record(p)) for p in ("1.2.3.4", "1.2.3.4", "5.6.7.8", "1.2.3.4")] == [
        True,
        False,
        True,
        False,
    ]
    clock.t += 60
    assert f.filter(record("1.2.3.4"))
