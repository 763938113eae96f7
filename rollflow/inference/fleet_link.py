"""``FleetLink``: a server supervisor's events reach the rollout's client (routing) and watcher (weights).

What it is: the listener a launched fleet's supervisor (``infra.supervisor.Supervisor``) calls. A server
that died is routed around and its ack retracted (the client's requests wait for it rather than fail);
a restarted one is caught up to the served version at once; a lost one is dropped from both for good;
a requested stop makes the client and the watcher quiet (servers going away are not faults).
What it is not: the supervision itself (``infra/supervisor.py``), or the bookkeeping of which servers
are live (``routing.ServerPool`` for the client, ``fleet_health.FleetHealth`` for the watcher).
"""

from __future__ import annotations

from rollflow.inference.client import EngineClient
from rollflow.inference.watcher import CheckpointWatcher


class FleetLink:
    """Passes a server supervisor's events to the rollout's client (routing) and watcher (weights)."""

    def __init__(self, client: EngineClient, watcher: CheckpointWatcher) -> None:
        self.client = client
        self.watcher = watcher

    def on_server_down(self, address: str, reason: str) -> None:
        self.client.pool.mark_down(address)
        self.client.pool.set_restarting(address, True)  # requests wait for it rather than fail
        self.watcher.server_down(address, reason)  # its ack must not hold checkpoint GC while it restarts

    def on_server_restarted(self, address: str) -> None:
        # It serves the initial weights: the watcher catches it up at once (no retry backoff), while the
        # client keeps routing around it for one more cooldown.
        self.client.pool.mark_down(address)
        self.client.pool.set_restarting(address, False)
        self.watcher.resync(address)

    def on_server_lost(self, address: str, reason: str) -> None:
        self.client.pool.drop(address, reason)
        self.watcher.drop_server(address, reason)

    def on_fleet_stopping(self) -> None:
        # A requested stop: servers going away now are not faults (no failover warnings, no ERRORs).
        self.client.shutdown()
        self.watcher.fleet.quiet = True
