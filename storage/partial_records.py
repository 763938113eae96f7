"""Partial records: the episodes a rollout process had in flight at a graceful stop, as one JSON object.

What it is: ``put_partials(storage, writer_id, episodes)`` writes ``rollout/partials/{writer_id}.json``
in one put (posix: temp file + rename; S3: one PutObject), so a record is whole or absent, never half
written; ``load_partials(storage)`` reads every record of the trial and returns the episodes by prompt
position (the newest record wins when two hold the same position: a stop after a resume that continued
it); ``delete_partials`` removes records a later one supersedes. Each episode is a plain dict
(``rollflow.rollout.partials`` builds and reads them): position, block, and its samples, each with the
request's input ids, output ids, logprobs, per-token versions, finish reason and token budget.

They live beside the rollout's state files, never under ``trajectories/``: the trainer never reads them.
What it is not: the capture or the continuation (``rollflow.rollout.partials``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from storage import keys
from storage.fs import Storage

logger = logging.getLogger(__name__)

PARTIALS_FORMAT = 1


def put_partials(storage: Storage, writer_id: str, episodes: list[dict[str, Any]]) -> str:
    """Write this process's partial episodes (one put); returns the key."""
    key = keys.partials_key(writer_id)
    doc = {"format": PARTIALS_FORMAT, "writer": writer_id, "saved_at": time.time(), "episodes": episodes}
    storage.put_json(key, doc)
    return key


def load_partials(storage: Storage) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """``({position: episode}, keys read)``; unreadable or foreign records are logged and skipped."""
    found: dict[int, tuple[float, dict[str, Any]]] = {}
    read: list[str] = []
    for key in storage.list(keys.PARTIALS_DIR):
        try:
            doc = storage.get_json(key)
        except (FileNotFoundError, ValueError) as e:
            logger.warning("partial record %s unreadable, skipped: %s", key, e)
            continue
        if not isinstance(doc, dict) or doc.get("format") != PARTIALS_FORMAT:
            logger.warning("partial record %s has an unknown format, skipped", key)
            continue
        read.append(key)
        at = float(doc.get("saved_at", 0.0))
        for ep in doc.get("episodes", []):
            p = int(ep["position"])
            if p not in found or found[p][0] < at:
                found[p] = (at, ep)
    return {p: ep for p, (_, ep) in found.items()}, read


def delete_partials(storage: Storage, keys_: list[str]) -> None:
    for key in keys_:
        storage.delete(key)
