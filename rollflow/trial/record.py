"""A trial's config record: ``record/config.json``, the config it runs with and every resume's overrides.

What it is: written when a trial starts, as JSON (no pickle) with every credential masked
(``redacted_dict``)::

    {"config": {...the resolved config...}, "created_at": t, "resumes": [{"at": t, "overrides": [...]}]}

``read_config_record`` / ``write_config_record`` (create-only: a second call keeps the first) and
``record_resume`` (the resumed config replaces the recorded one; its overrides join ``resumes``).
What it is not: the rule for what a resume runs with (``rollflow.trial.resume_policy``); the key itself
is ``storage.keys.CONFIG_RECORD_KEY``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.configuration.loader import redacted_dict
from storage import keys
from storage.errors import CommitConflictError
from storage.fs import Storage


def read_config_record(storage: Storage) -> dict[str, Any] | None:
    """The trial's config record, or None (a trial made before records existed, or a new one)."""
    try:
        doc = storage.get_json(keys.CONFIG_RECORD_KEY)
    except FileNotFoundError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("config"), dict) else None


def write_config_record(storage: Storage, cfg: ExperimentConfig) -> None:
    """Record the config a trial starts with (credentials masked), once; a second call keeps the first."""
    doc = {"config": redacted_dict(cfg), "created_at": time.time(), "resumes": []}
    with contextlib.suppress(CommitConflictError):
        storage.put_json(keys.CONFIG_RECORD_KEY, doc, exclusive=True)


def record_resume(
    storage: Storage, record: dict[str, Any], cfg: ExperimentConfig, overrides: Sequence[str]
) -> None:
    """Store ``cfg`` (the resumed config) as the trial's and append this resume's ``overrides``."""
    doc = {
        **record,
        "config": redacted_dict(cfg),
        "resumes": [*record.get("resumes", []), {"at": time.time(), "overrides": list(overrides)}],
    }
    storage.put_json(keys.CONFIG_RECORD_KEY, doc)


def resume_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides a resume gives on purpose: all but ``trial=`` (which names the trial to resume)."""
    return [o for o in overrides if o.split("=", 1)[0].strip() != "trial"]
