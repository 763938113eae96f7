"""Task: start the inference servers the config asks for, and stop them.

local: rollflow's CPU servers (infra/cpu_server) as child processes on 127.0.0.1; vllm: vLLM servers
through infra/vllm_launcher; sglang: SGLang servers through infra/sglang_launcher; external: servers
someone else runs.
Child servers are tied to this process (they die with it), so a cancelled flow run leaves no orphans.
Launched servers are supervised: one that dies is restarted on its address (``inference.max_restarts``).
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.servers import ExternalServers, ServerGroup, ServerHandle, launch_local_servers
from rollflow.api.config import ExperimentConfig


def weights_roots(cfg: ExperimentConfig) -> list[Path]:
    """Where the watcher points a launched server's weight updates: the checkpoint store's root when it
    is a local directory (checkpoints are verified and loaded in place) and the local cache. A CPU
    server refuses ``/update_weights_from_disk`` from anywhere else."""
    roots = [Path(cfg.storage.local_cache)]
    if "://" not in cfg.storage.root or cfg.storage.root.startswith("file://"):
        roots.append(Path(cfg.storage.root.removeprefix("file://")))
    return roots


@task(name="start-servers", cache_policy=NO_CACHE, persist_result=False)
def start_servers(cfg: ExperimentConfig, model_path: str) -> ServerHandle:
    """The servers' handle: ``.addresses``, ``.pids()`` and ``.stop()``."""
    logger = get_run_logger()
    inf = cfg.inference
    if inf.backend == "external":
        handle: ServerHandle = ExternalServers(inf.addresses)
    else:
        group = _launch(cfg, model_path)
        group.supervise(  # restart a launched server that dies (infra/supervisor.py)
            max_restarts=inf.max_restarts,
            interval_s=inf.supervise_interval_s,
            startup_timeout_s=restart_timeout_s(cfg),
        )
        handle = group
    logger.info("inference servers (%s): %s", inf.backend, ", ".join(handle.addresses))
    return handle


def restart_timeout_s(cfg: ExperimentConfig) -> float:
    """How long the supervisor waits for a restarted server: the backend's own start-up timeout."""
    inf = cfg.inference
    return {"vllm": inf.vllm.startup_timeout_s, "sglang": inf.sglang.startup_timeout_s}.get(
        inf.backend, inf.startup_timeout_s
    )


def _launch(cfg: ExperimentConfig, model_path: str) -> ServerGroup:
    if cfg.inference.backend == "sglang":
        from infra.sglang_launcher import launch_sglang_servers

        return launch_sglang_servers(cfg.inference, model_path, dtype=cfg.model.dtype)
    if cfg.inference.backend == "vllm":
        from infra.vllm_launcher import launch_vllm_servers

        return launch_vllm_servers(cfg.inference, model_path)
    return launch_local_servers(cfg.inference, model_path, weights_roots=weights_roots(cfg))


@task(name="stop-servers", cache_policy=NO_CACHE, persist_result=False)
def stop_servers(handle: ServerHandle) -> None:
    handle.stop()
