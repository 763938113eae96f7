"""FleetHealth on its own: unreachable then reachable again, acks and their retraction, the fatal rule."""

from __future__ import annotations

import time
from typing import Any

from infra.servers import free_port
from rollflow.inference.fleet_health import FleetHealth


class _Acks:
    """The two store calls FleetHealth makes, recorded."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, str, str]] = []
        self.retracted: list[tuple[int, str]] = []

    def ack(self, version: int, server_id: str, *, state: str = "serving") -> None:
        self.acks.append((version, server_id, state))

    def retract_ack(self, version: int, server_id: str) -> None:
        self.retracted.append((version, server_id))


def _fleet(servers: list[str], **kw: Any) -> tuple[FleetHealth, _Acks, list[str]]:
    store, fatal = _Acks(), []
    ids = [f"id-{a}" for a in servers]
    return FleetHealth(store, servers, ids, on_fatal=fatal.append, **kw), store, fatal  # type: ignore[arg-type]


def test_an_unreachable_server_stops_holding_the_others_back_until_it_answers_again() -> None:
    fleet, store, fatal = _fleet(["a", "b"])
    fleet.on_serving("a", 3)
    fleet.on_serving("b", 3)
    fleet.on_unreachable("b", "connection refused")
    assert fleet.live() == ["a", "b"]  # unreachable is still live: it may come back
    assert fleet.reachable() == ["a"]
    assert fleet.lagging(4) == {"a": 3}  # b's served version is forgotten while it is unreachable
    assert fleet.unreachable_summary() == "b (for 0s)"
    fleet.on_serving("b", 4)  # it answered a load of v4
    assert fleet.reachable() == ["a", "b"]
    assert fleet.unreachable_summary() == ""
    assert fleet.needing(4) == ["a"]  # b serves v4 and has acked it
    assert store.acks == [(3, "id-a", "serving"), (3, "id-b", "serving"), (4, "id-b", "serving")]
    assert not fatal


def test_dropping_every_server_is_fatal_once_and_retracts_their_acks() -> None:
    fleet, store, fatal = _fleet(["a", "b"])
    fleet.on_serving("a", 2)
    assert fleet.drop("a", "out of restarts")
    assert not fleet.drop("a", "again")  # already dropped: nothing happens
    assert not fleet.drop("c", "unknown")
    assert store.retracted == [(2, "id-a")]
    assert not fatal  # b is still live and not known unreachable
    assert fleet.drop("b", "out of restarts")
    assert store.retracted == [(2, "id-a")]  # b served nothing known: no ack to retract
    assert fatal == ["every inference server was dropped (none left): a: out of restarts; b: out of restarts"]
    assert fleet.live() == []


def test_no_answer_for_dead_server_timeout_is_fatal_once_per_outage() -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: /get_model_info is refused
    fleet, _, fatal = _fleet([dead], health_interval_s=0.0, dead_server_timeout_s=0.0)
    fleet.check_if_due()
    assert fleet.reachable() == []
    assert fatal == [f"no inference server has answered for 0s: {dead} (for 0s)"]
    fleet.check_if_due()
    assert len(fatal) == 1  # reported once
    fleet.on_serving(dead, 1)  # it answered again: the next outage is reported again
    fleet.check_if_due()
    assert len(fatal) == 2


def test_the_timeout_counts_from_the_last_server_lost_not_the_first() -> None:
    fleet, _, fatal = _fleet(["a", "b"], dead_server_timeout_s=60.0)
    now = time.monotonic()
    fleet.on_unreachable("a", "refused")
    fleet.on_unreachable("b", "refused")
    fleet._unreachable.update(a=now - 100, b=now - 30)  # a lost 100 s ago, b 30 s ago
    fleet._check_fatal()
    assert not fatal  # b answered 30 s ago: not yet 60 s without any answer
    fleet._unreachable["b"] = now - 61
    fleet._check_fatal()
    assert len(fatal) == 1 and fatal[0].startswith("no inference server has answered for 60s: ")
