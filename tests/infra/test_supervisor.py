"""A supervised fleet of real CPU inference servers: ``kill -9`` one and see what happens.

1. With restarts left, the server comes back on the same address; the listener hears "down" then
   "restarted"; a watcher that served v1 on it notices (the server now reports the initial weights)
   and loads v1 again, and its ack id is unchanged.
2. With no restarts left, the server is given up: the listener gets a ``ServerLostError`` message naming
   the address and the exit code, the client's pool never routes to it again, and the watcher drops
   it (its ack retracted) and goes on with the other server.
3. Ack expiry: a server from an earlier run of the trial (other port, other ack id) last acked v1 and
   is gone. With ``ack_ttl_s`` its ack stops holding GC back once it is older than the TTL, while the
   live server's acks, re-written by the watcher's heartbeat, keep what it serves.
4. A restart releases the dead server's ack: while a killed server restarts, the trainer's publishes
   and GC go on to ``keep`` versions (its ack was retired when it died, not after the 300 s TTL), and a
   watcher process killed with its flow leaves acks that hold nothing back.
5. A restarted server serves the current version as soon as it is healthy: the watcher loads it on
   the restart event, not when its retry backoff (grown while the server was down) runs out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rollflow.api.errors import ServerLostError
from rollflow.inference.routing import ServerPool, control_call
from rollflow.inference.watcher import CheckpointWatcher, default_server_id
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

WAIT_S = 120.0  # generous: a CPU server starts in ~5 s on an idle machine, far slower on a busy one


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.changed = threading.Event()

    def on_server_down(self, address: str, reason: str) -> None:
        self.events.append(("down", address, reason))
        self.changed.set()

    def on_server_restarted(self, address: str) -> None:
        self.events.append(("restarted", address, ""))
        self.changed.set()

    def on_server_lost(self, address: str, reason: str) -> None:
        self.events.append(("lost", address, reason))
        self.changed.set()

    def wait_for(self, kind: str) -> tuple[str, str, str]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for e in self.events:
                if e[0] == kind:
                    return e
            self.changed.wait(0.2)
            self.changed.clear()
        raise AssertionError(f"no {kind!r} event within {WAIT_S}s: {self.events}")


def served(addr: str) -> str:
    return str(control_call(addr, "/get_model_info")["weight_version"])


def wait_until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_killed_server_is_restarted_and_caught_up(
    tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    store = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"), ack_ttl_s=60.0)
    store.publish(tiny_model_dir, 0)
    store.publish(tiny_model_dir_b, 1)
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        addr = group.addresses[0]
        watcher = CheckpointWatcher(
            store, group.addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.2, ack_ttl_s=60.0
        )
        assert watcher.poll_once() == 1 and served(addr) == "1"
        rec = Recorder()
        sup = group.supervise(max_restarts=2, interval_s=0.2, startup_timeout_s=WAIT_S)
        sup.add_listener(rec)
        sup.add_listener(type("Link", (), {"on_server_restarted": lambda _, a: watcher.resync(a)})())
        watcher.start()
        try:
            old_pid = group.servers[0].process.pid
            os.kill(old_pid, signal.SIGKILL)
            down = rec.wait_for("down")
            assert down[1] == addr and "exited with code -9" in down[2]
            assert rec.wait_for("restarted")[1] == addr
            assert group.servers[0].process.pid != old_pid and group.addresses == [addr]
            assert sup.restarts[addr] == 1 and not sup.lost
            # the new process started on the initial weights; the watcher loads v1 into it again
            wait_until(lambda: served(addr) == "1", f"restarted server not caught up: {watcher.errors[-1:]}")
            assert store.acks() == {default_server_id(addr): 1}
            assert watcher.serving_version == 1
        finally:
            watcher.stop()


def test_a_server_out_of_restarts_is_dropped_with_a_clear_error(
    tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    store = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"))
    store.publish(tiny_model_dir, 0)
    with inference_lib.launch_cpu_servers(tiny_model_dir, 2) as group:
        dead, alive = group.addresses
        pool = ServerPool(group.addresses)
        fatal: list[str] = []
        watcher = CheckpointWatcher(
            store, group.addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.2, on_fatal=fatal.append
        )
        assert watcher.poll_once() == 0
        assert set(store.acks()) == {default_server_id(dead), default_server_id(alive)}
        rec = Recorder()
        sup = group.supervise(max_restarts=0, interval_s=0.2)
        sup.add_listener(rec)
        os.kill(group.servers[0].process.pid, signal.SIGKILL)
        lost = rec.wait_for("lost")
        assert lost[1] == dead
        assert (
            lost[2].startswith(f"giving up on inference server {dead}") and "exited with code -9" in lost[2]
        )
        assert isinstance(ServerLostError(lost[2]), ServerLostError)
        assert sup.lost == {dead: lost[2]} and sup.live_addresses == [alive]
        assert [e[0] for e in rec.events] == ["down", "lost"]  # no restart was tried
        pool.drop(dead, lost[2])
        assert {pool.pick(f"r{i}") for i in range(8)} == {alive}
        assert pool.pick("r", exclude=[alive]) is None  # never the dropped one, even as a last resort
        watcher.drop_server(dead, lost[2])
        assert store.acks() == {default_server_id(alive): 0}  # the dropped server's ack is retracted
        store.publish(tiny_model_dir_b, 1)
        assert watcher.poll_once() == 1 and served(alive) == "1"
        assert not fatal  # one server still answers
        watcher.drop_server(alive, "test")
        assert fatal and "none left" in fatal[0]


def test_dead_servers_acks_expire_and_gc_goes_on(
    tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        _expiry(group, tiny_model_dir, tiny_model_dir_b, tmp_path)


def _expiry(cpu_server: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path) -> None:
    storage = Storage.open(str(tmp_path / "store"), "exp", "trial")
    ttl = 30.0
    store = CheckpointStore(storage, ack_ttl_s=ttl)
    for v in range(4):
        store.publish(tiny_model_dir if v % 2 == 0 else tiny_model_dir_b, v)
    # A server of an earlier run of this trial (another port: another ack id) served v1, then died.
    gone = "host-127.0.0.1_1"
    storage.put_json(
        keys.ack_key(1, gone),
        {"server_id": gone, "version": 1, "state": "serving", "acked_at": time.time() - 2 * ttl},
    )
    watcher = CheckpointWatcher(store, cpu_server.addresses, cache_dir=tmp_path / "cache", ack_ttl_s=ttl)
    assert watcher.poll_once() == 3
    live_id = default_server_id(cpu_server.addresses[0])
    assert store.acks() == {live_id: 3}  # the dead server's ack has expired: not a live server
    # Without a TTL the dead ack would count, and hold v1 and v2 forever (the old behaviour):
    assert CheckpointStore(storage).acks() == {gone: 1, live_id: 3}
    assert store.gc(keep_last=1) == [0, 1, 2]
    # The heartbeat: once ack_ttl_s / 4 has passed, a poll with nothing new re-acks what is served.
    before = storage.get_json(keys.ack_key(3, live_id))["acked_at"]
    watcher.fleet._acked_at = {
        a: t - ttl / 4 for a, t in watcher.fleet._acked_at.items()
    }  # as if ttl/4 had passed
    assert watcher.poll_once() is None
    assert storage.get_json(keys.ack_key(3, live_id))["acked_at"] > before


def _committed(store: CheckpointStore) -> list[int]:
    return store.list_committed()


@contextlib.contextmanager
def _serving_v1(
    inference_lib: Any, models: tuple[Path, Path], tmp_path: Path, *, poll_interval_s: float
) -> Iterator[tuple[CheckpointStore, Any, CheckpointWatcher]]:
    """v0 and v1 published (ack TTL 300 s, the default), one CPU server, a watcher that loaded v1 into it."""
    store = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"), ack_ttl_s=300.0)
    store.publish(models[0], 0)
    store.publish(models[1], 1)
    with inference_lib.launch_cpu_servers(models[0], 1) as group:
        watcher = CheckpointWatcher(
            store,
            group.addresses,
            cache_dir=tmp_path / "cache",
            poll_interval_s=poll_interval_s,
            ack_ttl_s=300.0,
        )
        assert watcher.poll_once() == 1
        yield store, group, watcher


def _fleet_link(group: Any, watcher: CheckpointWatcher) -> Any:
    """The rollout task's link from the supervisor to the client's routing and the watcher."""
    from rollflow.inference.fleet_link import FleetLink

    return FleetLink(SimpleNamespace(pool=ServerPool(group.addresses)), watcher)


def test_a_killed_servers_ack_is_retired_at_once_and_gc_goes_on_while_it_restarts(
    tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    models = (tiny_model_dir, tiny_model_dir_b)
    with _serving_v1(inference_lib, models, tmp_path, poll_interval_s=0.2) as (store, group, watcher):
        addr = group.addresses[0]
        assert store.acks() == {default_server_id(addr): 1}
        rec = Recorder()
        sup = group.supervise(max_restarts=2, interval_s=0.2, startup_timeout_s=WAIT_S)
        sup.add_listener(rec)
        sup.add_listener(_fleet_link(group, watcher))
        watcher.start()
        try:
            os.kill(group.servers[0].process.pid, signal.SIGKILL)
            rec.wait_for("down")
            # the trainer goes on: publish + GC (keep 2) while the server restarts
            for v in (2, 3, 4):
                store.publish(tiny_model_dir if v % 2 == 0 else tiny_model_dir_b, v)
                store.gc(keep_last=2)
            while_down = _committed(store)
            restarted = [e for e in rec.events if e[0] == "restarted"]
            rec.wait_for("restarted")
            wait_until(lambda: served(addr) == "4", f"restarted server not caught up: {watcher.errors[-1:]}")
            store.publish(tiny_model_dir_b, 5)
            store.gc(keep_last=2)
            after = _committed(store)
        finally:
            watcher.stop()
    print(f"checkpoints on disk: while the server restarted {while_down}, one publish after {after}")
    assert not restarted, "the server came back before the publishes: nothing was measured"
    # Before: the dead server's v1 ack held GC for its 300 s TTL: [1, 2, 3, 4] while it restarted.
    # A "loading" ack of the newest version (the watcher trying it) may keep one more for a moment.
    assert len(while_down) <= 3 and 1 not in while_down, while_down
    assert after == [4, 5], after


def test_acks_of_a_watcher_process_killed_with_its_flow_hold_nothing_back(
    cpu_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    storage = Storage.open(str(root), "exp", "trial")
    store = CheckpointStore(storage, ack_ttl_s=300.0)
    store.publish(tiny_model_dir, 0)  # what the shared server serves: the sidecar acks it, loads nothing
    cmd = [
        sys.executable, "-m", "infra.watcher_sidecar", "--storage-root", str(root), "--experiment", "exp",
        "--trial", "trial", "--servers", cpu_server.addresses[0], "--cache-dir", str(tmp_path / "cache"),
        "--poll-interval-s", "0.2",
    ]  # fmt: skip
    sidecar = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: store.acks() == {default_server_id(cpu_server.addresses[0]): 0}, "no ack")
    finally:
        sidecar.kill()  # as when its flow is SIGKILLed: nothing retracts the ack
        sidecar.wait()
    store.publish(tiny_model_dir, 1)
    store.publish(tiny_model_dir, 2)
    # Before: the ack lived for its 300 s TTL and GC kept v0 (the floor): [0, 1, 2] on disk.
    assert store.acks() == {} and store.gc(keep_last=1) == [0, 1]
    assert _committed(store) == [2]


def test_a_restarted_server_serves_the_current_version_without_the_retry_backoff(
    tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    from infra.supervisor import Supervisor

    serving = _serving_v1(inference_lib, (tiny_model_dir, tiny_model_dir_b), tmp_path, poll_interval_s=0.5)
    with serving as (store, group, watcher):
        sup = Supervisor(group, max_restarts=2, startup_timeout_s=WAIT_S)  # checked by hand below
        restart: dict[str, float] = {}

        class Clock:
            def on_server_restarted(self, address: str) -> None:
                restart["at"] = time.monotonic()
                restart["backoff_left_s"] = watcher._failures[2][1] - restart["at"]

        sup.add_listener(Clock())
        sup.add_listener(_fleet_link(group, watcher))
        watcher.start()
        try:
            os.kill(group.servers[0].process.pid, signal.SIGKILL)
            store.publish(tiny_model_dir, 2)  # tried while the server is dead: the backoff grows
            wait_until(lambda: watcher._failures.get(2, (0, 0.0))[0] >= 6, "the watcher did not retry v2")
            sup.check_once()  # sees it dead, restarts it, waits for /health, then tells the listeners
            wait_until(
                lambda: served(group.addresses[0]) == "2",
                f"restarted server not caught up: {watcher.errors[-1:]}",
            )
            serving_s = time.monotonic() - restart["at"]
        finally:
            watcher.stop()
    print(f"healthy -> serving v2 in {serving_s:.2f}s; the backoff had {restart['backoff_left_s']:.1f}s left")
    assert restart["backoff_left_s"] > 3.0, restart  # the scenario: without the fix it would wait this long
    assert serving_s < 3.0, (serving_s, restart)
