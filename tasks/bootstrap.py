"""Task: make sure the initial policy exists (build the tiny model when the config asks for it)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig


@task(name="bootstrap-model", cache_policy=NO_CACHE, persist_result=False, retries=1)
def bootstrap_model(cfg: ExperimentConfig) -> str:
    """Return the local path of the initial policy, building the tiny model first if configured."""
    logger = get_run_logger()
    if cfg.model.bootstrap_tiny:
        from rollflow.models.bootstrap import bootstrap_for

        path = bootstrap_for(cfg)  # warm-started for the task the run trains on
        logger.info("tiny model ready at %s", path)
        return str(path)
    if not Path(cfg.model.path).exists() and "/" not in cfg.model.path.strip("/"):
        raise FileNotFoundError(
            f"model.path {cfg.model.path!r} does not exist; set model.bootstrap_tiny=true for the "
            "embedded tiny model or point model.path at a Hugging Face directory"
        )
    return cfg.model.path
