"""The nightly retrain's starting point: the registered policy (alias ``latest-rl``) on a fresh data draw.

What it is: ``from_registry(cfg)`` downloads the registered policy into the local cache and returns the
config of a new trial that starts from it (``model.path`` there, no tiny bootstrap) and, for a synthetic
dataset, a new draw (its seed is today's date), with the registered version it started from.
What it is not: the registry gate that decides what is registered (``rollflow.tracking.registry_gate``).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from rollflow.api.config import ExperimentConfig

log = logging.getLogger(__name__)


def from_registry(cfg: ExperimentConfig) -> tuple[ExperimentConfig, str]:
    """(the config that starts from the registered policy, its registered version)."""
    from rollflow.tracking.mlflow_tracker import MlflowTracker, download_latest_registered

    tracker = MlflowTracker(cfg)
    local, tags = download_latest_registered(
        tracker.tracking_uri, tracker.model_name, f"{cfg.storage.local_cache}/registry/{cfg.trial}"
    )
    source = tags["registry_version"]
    log.info("retraining from registered %s v%s at %s", tracker.model_name, source, local)
    model = dataclasses.replace(cfg.model, path=str(local), bootstrap_tiny=False)
    dataset = cfg.dataset
    if dataset.kind == "synthetic":  # fresh data: a new draw of the synthetic task per retrain
        dataset = dataclasses.replace(
            dataset, synthetic=dataclasses.replace(dataset.synthetic, seed=int(time.strftime("%Y%m%d")))
        )
    return dataclasses.replace(cfg, model=model, dataset=dataset), source
