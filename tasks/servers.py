"""Task: start the inference servers the config asks for, and stop them.

local: rollflow's CPU servers (infra/cpu_server) as child processes on 127.0.0.1; vllm: vLLM servers
through infra/vllm_launcher; sglang: SGLang servers through infra/sglang_launcher; external: servers
someone else runs.
Child servers are tied to this process (they die with it), so a cancelled flow run leaves no orphans.
Launched servers are supervised: one that dies is restarted on its address (``inference.max_restarts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig


class ExternalServers:
    """Servers this flow does not own: nothing to stop."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)

    def stop(self) -> None:
        return None

    def pids(self) -> dict[str, int]:
        return {}  # not our processes: nothing to meter


def weights_roots(cfg: ExperimentConfig) -> list[Path]:
    """Where the watcher points a launched server's weight updates: the checkpoint store's root when it
    is a local directory (checkpoints are verified and loaded in place) and the local cache. A CPU
    server refuses ``/update_weights_from_disk`` from anywhere else."""
    roots = [Path(cfg.storage.local_cache)]
    if "://" not in cfg.storage.root or cfg.storage.root.startswith("file://"):
        roots.append(Path(cfg.storage.root.removeprefix("file://")))
    return roots


@task(name="start-servers", cache_policy=NO_CACHE, persist_result=False)
def start_servers(cfg: ExperimentConfig, model_path: str) -> Any:
    """Return a handle with ``.addresses`` and ``.stop()``."""
    logger = get_run_logger()
    inf = cfg.inference
    if inf.backend == "external":
        handle: Any = ExternalServers(inf.addresses)
    elif inf.backend == "sglang":
        from infra.sglang_launcher import launch_sglang_servers

        handle = launch_sglang_servers(cfg.inference, model_path)
    elif inf.backend == "vllm":
        from infra.vllm_launcher import launch_vllm_servers

        handle = launch_vllm_servers(cfg.inference, model_path)
    else:
        from infra.servers import launch_local_servers

        handle = launch_local_servers(cfg.inference, model_path, weights_roots=weights_roots(cfg))
    if inf.backend != "external":  # restart a launched server that dies (infra/supervisor.py)
        handle.supervise(
            max_restarts=inf.max_restarts,
            interval_s=inf.supervise_interval_s,
            startup_timeout_s=inf.vllm.startup_timeout_s if inf.backend == "vllm" else inf.startup_timeout_s,
        )
    logger.info("inference servers (%s): %s", inf.backend, ", ".join(handle.addresses))
    return handle


@task(name="stop-servers", cache_policy=NO_CACHE, persist_result=False)
def stop_servers(handle: Any) -> None:
    handle.stop()
