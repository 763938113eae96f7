"""Checkpoint acknowledgements and garbage collection: which versions servers use, and deleting the rest.

GC rule: keep the newest ``keep_last`` committed versions, and never delete a version >= the floor, the
minimum over servers of each server's latest ack (acks older than ``ack_ttl_s`` count as dead servers, if
a ttl is set). An ack is bound to the process that wrote it (its ``owner``: host, pid and pid namespace):
an ack whose owner ran here and is no longer running is dead at once, whatever its age (a watcher killed
with its flow, whose servers died with it, holds nothing back after the trial is resumed); an ack from
another host lives until its TTL. A watcher acks N as "loading" BEFORE it verifies or loads N, so the
floor covers what is being loaded, and GC re-checks a victim's acks just before deleting it. Deletion
removes COMMIT.json first, so a version is never committed-but-partial.

What it is not: publishing or resolving versions (``storage.checkpoints``; ``CheckpointStore`` exposes
``ack``, ``retract_ack``, ``acks`` and ``gc`` from here).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Literal

from storage import keys
from storage.checkpoint_commit import COMMIT_RE
from storage.fs import Storage

logger = logging.getLogger(__name__)

ACK_RE = re.compile(r"^checkpoints/v(\d{6,})/acks/([^/]+)\.json$")


def _pid_space() -> str:
    """This machine's boot and pid namespace: where a pid means this very process (two containers with
    one hostname, or two hosts both called "localhost", never compare pids across each other)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def ack_owner() -> dict[str, Any]:
    """Who writes an ack: this host and process (`_owner_gone` tells when it has ended)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": _pid_space()}


def _owner_gone(owner: Any) -> bool:
    """True when an ack's owner ran here (same host, boot and pid namespace) and its process is gone;
    False when it may be alive or cannot be checked from here (another host, no owner recorded: the
    TTL decides)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return False
    space = _pid_space()
    if not space or owner.get("pid_space") != space:
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: a process of another user holds the pid, so it is not ours, and not dead
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed process its parent has not reaped yet still has a pid; it serves nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


class CheckpointAcks:
    """The acks and GC of one trial's checkpoints on a ``Storage``; ``ack_ttl_s``: see the GC rule."""

    def __init__(self, storage: Storage, ack_ttl_s: float | None = None) -> None:
        self.storage = storage
        self.ack_ttl_s = ack_ttl_s

    def ack(self, version: int, server_id: str, *, state: Literal["loading", "serving"] = "serving") -> None:
        """Record that `server_id` serves `version`, or (state="loading") is about to verify and load it.
        The ack names its owner, this process (`ack_owner`)."""
        self.storage.put_json(
            keys.ack_key(version, server_id),
            {
                "server_id": server_id,
                "version": version,
                "state": state,
                "acked_at": time.time(),
                "owner": ack_owner(),
            },
        )

    def retract_ack(self, version: int, server_id: str) -> None:
        """Delete `server_id`'s ack of `version` (a "loading" ack whose load failed). Idempotent."""
        self.storage.delete(keys.ack_key(version, server_id))

    def acks(self) -> dict[str, int]:
        """Latest acked version per live server (servers whose latest ack is older than ack_ttl_s are dropped)."""
        return self._live_acks([k for k in self.storage.list(keys.CHECKPOINT_DIR) if ACK_RE.match(k)])

    def _live_acks(self, ack_keys: list[str]) -> dict[str, int]:
        latest: dict[str, int] = {}
        for k in ack_keys:
            m = ACK_RE.match(k)
            assert m is not None
            v, server = int(m.group(1)), m.group(2)
            latest[server] = max(v, latest.get(server, -1))
        now = time.time()
        live: dict[str, int] = {}
        for server, v in latest.items():
            try:
                doc = self.storage.get_json(keys.ack_key(v, server))
                acked_at = float(doc["acked_at"])
            except (FileNotFoundError, ValueError, KeyError, TypeError, RecursionError):
                if self.ack_ttl_s is None:
                    live[server] = v  # without a TTL an unreadable ack still counts, as it always did
                continue
            if _owner_gone(doc.get("owner")):
                continue
            if self.ack_ttl_s is None or now - acked_at <= self.ack_ttl_s:
                live[server] = v
        return live

    def gc(self, keep_last: int) -> list[int]:
        """Delete old versions per the GC rule (module docstring); returns the deleted versions.

        Also removes uncommitted (abandoned) version dirs older than every kept version. A committed
        victim that gained an ack after the floor was computed (a watcher began loading it) is kept.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        listing = self.storage.list(keys.CHECKPOINT_DIR)
        committed = sorted(int(m.group(1)) for k in listing if (m := COMMIT_RE.match(k)))
        if not committed:
            return []
        seen_acks = [k for k in listing if ACK_RE.match(k)]
        keep = set(committed[-keep_last:])
        served = self._live_acks(seen_acks)
        floor = min(served.values()) if served else None
        oldest_kept = min(keep)
        victims = [v for v in committed if v not in keep and (floor is None or v < floor)]
        committed_set = set(committed)
        for d in self.storage.list_dirs(keys.CHECKPOINT_DIR):
            v = keys.parse_version_dir(d)
            if v is not None and v not in committed_set and v < oldest_kept and (floor is None or v < floor):
                victims.append(v)
        deleted = []
        seen = set(seen_acks)
        for v in sorted(victims):
            if v in committed_set and any(k not in seen for k in self.storage.list(keys.ack_dir(v))):
                logger.debug("checkpoint gc: keeping v%06d, a server acked it meanwhile", v)
                continue
            self.storage.delete(keys.checkpoint_commit_key(v))  # un-commit first
            self.storage.delete(keys.checkpoint_dir(v), recursive=True)
            deleted.append(v)
        if deleted:
            logger.debug(
                "checkpoint gc: deleted %s (keep_last=%d, served floor=%s)", deleted, keep_last, floor
            )
        return deleted
