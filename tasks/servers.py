"""Task: start the inference servers the config asks for, and stop them.

local: rollflow's CPU servers (infra/cpu_server) as child processes on 127.0.0.1; vllm: vLLM servers
through infra/vllm_launcher; sglang: SGLang servers through infra/sglang_launcher; external: servers
someone else runs.
Child servers are tied to this process (they die with it), so a cancelled flow run leaves no orphans.
Launched servers are supervised: one that dies is restarted on its address (``inference.max_restarts``).
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.launch import launch_configured_servers, restart_timeout_s
from infra.servers import ExternalServers, ServerHandle
from rollflow.api.config import ExperimentConfig


@task(name="start-servers", cache_policy=NO_CACHE, persist_result=False)
def start_servers(cfg: ExperimentConfig, model_path: str) -> ServerHandle:
    """The servers' handle: ``.addresses``, ``.pids()`` and ``.stop()``."""
    logger = get_run_logger()
    inf = cfg.inference
    if inf.backend == "external":
        handle: ServerHandle = ExternalServers(inf.addresses)
    else:
        group = launch_configured_servers(cfg, model_path)
        group.supervise(  # restart a launched server that dies (infra/supervisor.py)
            max_restarts=inf.max_restarts,
            interval_s=inf.supervise_interval_s,
            startup_timeout_s=restart_timeout_s(cfg),
        )
        handle = group
    logger.info("inference servers (%s): %s", inf.backend, ", ".join(handle.addresses))
    return handle


@task(name="stop-servers", cache_policy=NO_CACHE, persist_result=False)
def stop_servers(handle: ServerHandle) -> None:
    handle.stop()
