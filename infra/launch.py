"""The inference servers an experiment's config asks for, started: one entry for the flow and the checks.

What it is: ``launch_configured_servers(cfg, model_path)`` picks the launcher of ``inference.backend``
(SGLang, vLLM or rollflow's CPU server), with the model's dtype for SGLang and, for the CPU server, the
directories it may load weights from (``weights_roots``); ``restart_timeout_s`` is how long a supervisor
waits for one of them to come back.

What it is not: supervision (``ServerGroup.supervise``), the engines' command lines
(``rollflow.inference``), or anything for ``backend: external`` (servers someone else runs).
"""

from __future__ import annotations

from pathlib import Path

from infra.servers import ServerGroup, launch_local_servers
from rollflow.api.config import ExperimentConfig


def weights_roots(cfg: ExperimentConfig) -> list[Path]:
    """Where the watcher points a launched server's weight updates: the checkpoint store's root when it
    is a local directory (checkpoints are verified and loaded in place) and the local cache. A CPU
    server refuses ``/update_weights_from_disk`` from anywhere else."""
    roots = [Path(cfg.storage.local_cache)]
    if "://" not in cfg.storage.root or cfg.storage.root.startswith("file://"):
        roots.append(Path(cfg.storage.root.removeprefix("file://")))
    return roots


def restart_timeout_s(cfg: ExperimentConfig) -> float:
    """How long the supervisor waits for a restarted server: the backend's own start-up timeout."""
    inf = cfg.inference
    return {"vllm": inf.vllm.startup_timeout_s, "sglang": inf.sglang.startup_timeout_s}.get(
        inf.backend, inf.startup_timeout_s
    )


def launch_configured_servers(cfg: ExperimentConfig, model_path: str | Path) -> ServerGroup:
    """``inference.n_servers`` servers of ``inference.backend`` for ``model_path``, healthy.

    Raises:
        ServerStartupError: a server did not answer /health in time (its log tail in the message).
    """
    if cfg.inference.backend == "sglang":
        from infra.sglang_launcher import launch_sglang_servers

        return launch_sglang_servers(cfg.inference, model_path, dtype=cfg.model.dtype)
    if cfg.inference.backend == "vllm":
        from infra.vllm_launcher import launch_vllm_servers

        return launch_vllm_servers(cfg.inference, model_path)
    return launch_local_servers(cfg.inference, model_path, weights_roots=weights_roots(cfg))
