"""Rollout workers' state files: each worker's resume point and heartbeat, and who adopted a block.

What it is: the storage side of a rollout worker's state (``rollflow.rollout.loop.RolloutWorker``):

```
rollout/state-{name}.json          WorkerState (format 2), replaced after every commit, claim and heartbeat
prompts/takeovers/{b}-{gen}.json   read here only to learn who adopted block b (storage.prompt_claims writes it)
```

A ``WorkerStateStore`` is bound to one worker name. ``load`` reads that worker's earlier life (None for a
fresh worker; a format-1 file, one writer and no claims, gives only its counters); ``put`` replaces it;
``others`` reads every other worker's current state (files that are unreadable, half-written or of
another format are skipped: a peer's file is never a reason to stop); ``taken_over_by`` names the writer
that adopted a block. A state names its blocks as ``{"<block>": {"gen": g, "open": [positions]}}``.

``seq`` orders one worker's states: every state is stamped with ``next_seq()`` when it is built, and
``put`` writes it only if no later-built state was written before it (a compare-and-set on the last
written ``seq``, under one lock held across the write). The loop builds states on three threads (the
heartbeat, a claim, a commit) and puts them on others, so without it a heartbeat built before a commit
could land after the commit's state and the file would go back for a moment. ``load`` starts the
counter at the earlier life's ``seq``, so the numbers keep growing across restarts. Files written before
the field existed read as ``seq`` 0.

``claim_mark`` closes the window between a claim and the state put that records it: it is the claim
log's next block when the state was built, so every block the worker claimed below it is in the file (or
finished), and a claim of the worker's at or above it is one the file never saw. A resume (or a peer
adopting a dead worker) reads those claims from the claim log (``ClaimLog.claims_by``) and runs them.
None in files written before the field existed: nothing is looked up.

The writer ids of one worker's lives (``incarnations``) are ``{name}-{8 hex digits}`` (``ShardWriter``
makes them), so ``is_incarnation_of`` tells a worker's own earlier lives from other workers.

What it is not: the claims and takeovers themselves (``storage.prompt_claims``), or the policy: when a
silent peer counts as dead (``rollout.worker_lease_s``) is the worker's decision.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from storage import keys
from storage.fs import Storage

STATE_FORMAT = 2  # format 1 (one writer, no claims) is read as "nothing to adopt"


@dataclass(frozen=True)
class WorkerState:
    """One worker's state file. ``released`` = rejected + failed + evicted groups of all its lives."""

    writer: str = ""  # the worker's stable name
    incarnation: str = ""  # the writer id of the life that wrote this file
    epoch: int = 0  # of the next data position
    position: int = 0
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)  # held blocks and their open positions
    accepted: int = 0
    rejected: int = 0
    failed: int = 0
    released: int = 0
    updated_at: float | None = None  # time.time() of the put: the heartbeat
    claim_mark: int | None = None  # the claim log's next block when built: later claims are unrecorded
    seq: int = 0  # build order (WorkerStateStore.next_seq): a put never replaces a later-built state

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "writer": self.writer,
            "incarnation": self.incarnation,
            "epoch": self.epoch,
            "position": self.position,
            "blocks": self.blocks,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "failed": self.failed,
            "released": self.released,
            "updated_at": self.updated_at,
            "claim_mark": self.claim_mark,
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> WorkerState:
        """A format-2 document (missing counters read as 0)."""
        stamp, mark = doc.get("updated_at"), doc.get("claim_mark")
        return cls(
            writer=str(doc.get("writer", "")),
            incarnation=str(doc.get("incarnation", "")),
            epoch=int(doc.get("epoch", 0)),
            position=int(doc.get("position", 0)),
            blocks=dict(doc.get("blocks", {})),
            accepted=int(doc.get("accepted", 0)),
            rejected=int(doc.get("rejected", 0)),
            failed=int(doc.get("failed", 0)),
            released=int(doc.get("released", 0)),
            updated_at=None if stamp is None else float(stamp),
            claim_mark=None if mark is None else int(mark),
            seq=int(doc.get("seq", 0)),
        )


def is_incarnation_of(writer_id: str, name: str) -> bool:
    """Is ``writer_id`` one of the lives of worker ``name`` (``{name}-{8 hex}``)?"""
    return re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{8}}", writer_id) is not None


class WorkerStateStore:
    """The state file of worker ``name``, its peers' state files, and block takeovers (one trial)."""

    def __init__(self, storage: Storage, name: str) -> None:
        self.storage = storage
        self.name = name
        self.key = keys.rollout_state_key(name)
        self._lock = threading.Lock()  # guards _seq and _written and is held across a put's write
        self._seq = 0  # the last seq handed out
        self._written = 0  # the seq of the state in the file (as far as this process knows)

    def load(self) -> WorkerState | None:
        """This worker's earlier life; None if it has none. ``ValueError`` for a file this version
        cannot read (the message says how to start the data over)."""
        try:
            doc = self.storage.get_json(self.key)
        except FileNotFoundError:
            return None
        if isinstance(doc, dict) and doc.get("format") == 1:
            return WorkerState(rejected=int(doc.get("rejected", 0)), failed=int(doc.get("failed", 0)))
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise ValueError(
                f"rollout state {self.key} has an unknown format; delete it to start the data over"
            )
        state = WorkerState.from_json(doc)
        with self._lock:  # this life's states come after the earlier life's
            self._seq = max(self._seq, state.seq)
            self._written = max(self._written, state.seq)
        return state

    def next_seq(self) -> int:
        """The stamp of a state being built now: larger than every stamp handed out before."""
        with self._lock:
            self._seq += 1
            return self._seq

    def put(self, state: WorkerState) -> bool:
        """Write ``state`` unless a later-built one (higher ``seq``) is already written; True if written."""
        with self._lock:
            if state.seq < self._written:
                return False  # built before the file's state: writing it would turn the file back
            self.storage.put_json(self.key, state.to_json())
            self._written = state.seq
            return True

    def others(self) -> list[WorkerState]:
        """Every other worker's current state (unreadable or foreign-format files skipped)."""
        out = []
        for key in self.storage.list(keys.ROLLOUT_DIR):
            if key == self.key or not keys.is_rollout_state_key(key):
                continue
            try:
                doc = self.storage.get_json(key)
            except (FileNotFoundError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("format") == STATE_FORMAT:
                out.append(WorkerState.from_json(doc))
        return out

    def taken_over_by(self, block: int, gen: int) -> str:
        """The writer id that adopted ``block`` for generation ``gen`` ("" if none or unreadable)."""
        try:
            doc = self.storage.get_json(keys.takeover_key(block, gen))
        except (FileNotFoundError, ValueError):
            return ""
        return str(doc.get("by", "")) if isinstance(doc, dict) else ""
