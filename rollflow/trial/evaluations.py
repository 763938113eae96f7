"""A trial's evaluation records: ``eval/v{N}.json``, one per scored checkpoint version.

What it is: ``write_eval_record`` stores an evaluation under the version it scored; v0 is the 'before'
score and is create-only: nothing replaces it. Another version's record is replaced by a new
evaluation of it. ``eval_record`` reads one back (``rollflow ls`` and the registry gate read them).
What it is not: the evaluation (``rollflow.evaluation``) or what its numbers mean (``rollflow.eval_scores``).
"""

from __future__ import annotations

from typing import Any

from storage import keys
from storage.errors import CommitConflictError
from storage.fs import Storage


def write_eval_record(storage: Storage, doc: dict[str, Any]) -> bool:
    """Store an evaluation record under ``eval/v{doc['version']}.json``; False when it is a v0 record and
    one is there already (kept: the 'before' score is never overwritten)."""
    version = int(doc["version"])
    try:
        storage.put_json(keys.eval_key(version), doc, exclusive=version == 0)
    except CommitConflictError:
        return False
    return True


def eval_record(storage: Storage, version: int) -> dict[str, Any] | None:
    """The evaluation record of ``version``, or None."""
    try:
        doc = storage.get_json(keys.eval_key(version))
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
