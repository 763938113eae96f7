"""Launch SGLang servers (``python -m sglang.launch_server``) from config, wait for /health, stop them.

What it is: ``launch_sglang_servers`` (``cfg.n_servers`` servers on one GPU node, server i on GPUs
``base_gpu_id + i * tp_size`` onward, started as children through ``infra.servers.ServerGroup``: logs to
files, SIGTERM then SIGKILL on stop, children die with the launcher). The argv is
``rollflow.inference.sglang.sglang_command`` (unit-tested). The checkpoint watcher then keeps them on the
newest weights through ``/update_weights_from_disk`` (see docs/inference.md for the sidecar layout on a
GPU pool).

What it is not: an SGLang installation (the ``gpu`` extra; it cannot be installed on CPU machines), and
no multi-node placement (one launcher per node; the work pool decides the nodes).

SGLang takes its API key only as ``--api-key`` on the command line; logs show it redacted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from infra.servers import ServerGroup, free_port, start_servers
from rollflow.api.config import InferenceConfig
from rollflow.inference.sglang import sglang_command

logger = logging.getLogger(__name__)


def launch_sglang_servers(
    cfg: InferenceConfig,
    model_path: str | Path,
    *,
    weight_version: str | None = None,
    dtype: str | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> ServerGroup:
    """Start ``cfg.n_servers`` SGLang servers and wait up to ``cfg.sglang.startup_timeout_s`` for /health.

    Ports: ``cfg.base_port + i`` or free ports; server i gets ``--base-gpu-id cfg.sglang.base_gpu_id +
    i * tp_size``. Raises ``ServerStartupError`` with the failing server's log tail.
    """
    sg = cfg.sglang
    version = weight_version if weight_version is not None else cfg.initial_weight_version
    ports = (
        [cfg.base_port + i for i in range(cfg.n_servers)]
        if cfg.base_port
        else [free_port(cfg.host) for _ in range(cfg.n_servers)]
    )
    commands = [
        sglang_command(
            model_path,
            port=p,
            host=cfg.host,
            sglang=sg,
            api_key=cfg.api_key,
            weight_version=version,
            base_gpu_id=sg.base_gpu_id + i * sg.tp_size,
            dtype=dtype,
        )
        for i, p in enumerate(ports)
    ]
    group = start_servers(
        commands,
        [f"{cfg.host}:{p}" for p in ports],
        env=env,
        log_dir=log_dir,
        shutdown_timeout_s=cfg.shutdown_timeout_s,
        name="sglang",
    )
    try:
        group.wait_healthy(sg.startup_timeout_s)
    except BaseException:
        group.stop(timeout_s=cfg.shutdown_timeout_s)
        raise
    logger.info("SGLang servers ready: %s", ", ".join(group.addresses))
    return group
