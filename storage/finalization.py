"""``FINALIZED.json``: the record that a trial is whole, written last.

What it is: ``mark_finalized`` / ``read_finalized`` of the trial-root key ``FINALIZED.json``. A trial is
done when its final evaluation, the end of its MLflow run and its registry decision are recorded, not
when training stops; the flow writes this record after all three, so its existence means they are there
(the manifest-last rule). A trial whose trainer wrote ``trainer/DONE.json`` but that has no record was
stopped between training and finalization, and a resume finalizes it (``rollflow.trial.finalization``)::

    trainer/DONE.json   FINALIZED.json   the trial is
    absent              absent           unfinished: a resume trains on
    present             absent           trained: a resume runs the missing finalization steps, once
    present             present          finished: a resume reports it and changes nothing

What it is not: the finalization itself (``rollflow/trial/finalization.py``) nor the trainer's done marker
(``storage.checkpoints.CheckpointStore.mark_done``).
"""

from __future__ import annotations

import time
from typing import Any

from storage import keys
from storage.fs import Storage


def mark_finalized(storage: Storage, info: dict[str, Any]) -> None:
    """Write ``FINALIZED.json`` with ``info`` (final version, accuracy, MLflow run, registry decision)."""
    storage.put_json(keys.FINALIZED_KEY, {**info, "finalized_at": time.time()})


def read_finalized(storage: Storage) -> dict[str, Any] | None:
    """The record, or None while the trial is not finalized."""
    try:
        return storage.get_json(keys.FINALIZED_KEY)
    except FileNotFoundError:
        return None
