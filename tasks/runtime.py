"""Process-level setup shared by every flow: offline/telemetry env defaults and the resolved config.

What it is: ``configure_process_env`` (setdefault of the variables docs/operations.md lists) and
``resolve_config`` (YAML + overrides -> ExperimentConfig, with the resolved YAML logged).
What it is not: anything that touches storage or servers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.api.config_loader import load_config, to_yaml

T = TypeVar("T")

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
}


def configure_process_env() -> None:
    """Set telemetry-free, hub-offline defaults unless the user chose otherwise."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


@task(name="resolve-config", cache_policy=NO_CACHE, persist_result=False)
def resolve_config(
    config: str | None, overrides: list[str] | None = None, data: dict[str, Any] | None = None
) -> ExperimentConfig:
    cfg = load_config(config, overrides or [], data=data)
    get_run_logger().info("resolved config (secrets redacted):\n%s", to_yaml(cfg))
    return cfg


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that also works where an event loop already runs in this thread (Jupyter):
    the coroutine then runs on a fresh loop in a helper thread and this thread waits for it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollflow-sync") as pool:
        return pool.submit(asyncio.run, coro).result()
