"""``open_trial_storage(cfg)``: the storage of the trial a config names, opened one way everywhere.

What it is: ``Storage.open(cfg.storage.root, cfg.experiment, trial, cfg.storage.options)`` under one typed
name, so that the layout ``{root}/{experiment}/{trial}/`` and the storage options are spelled once. What it
is not: the storage layer (``storage/fs.py`` opens and checks roots) nor trial selection
(``rollflow/trial/choice.py`` decides which trial a run continues).
"""

from __future__ import annotations

from rollflow.api.config import ExperimentConfig
from storage.fs import Storage


def open_trial_storage(cfg: ExperimentConfig, trial: str | None = None) -> Storage:
    """The storage of ``trial`` (default ``cfg.trial``) in ``cfg.experiment`` under ``cfg.storage.root``."""
    return Storage.open(
        cfg.storage.root, cfg.experiment, cfg.trial if trial is None else trial, cfg.storage.options
    )
