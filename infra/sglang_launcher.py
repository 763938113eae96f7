"""Launch SGLang servers (``python -m sglang.launch_server``) from config, wait for /health, stop them.

What it is: ``launch_sglang_servers`` (``cfg.n_servers`` servers on one node, server i on GPUs
``base_gpu_id + i * tp_size`` onward, or on the CPU; started as children through
``infra.servers.ServerGroup``: logs to files, SIGTERM then SIGKILL on stop, children die with the
launcher). The argv is ``rollflow.inference.sglang.sglang_command`` (unit-tested); this module resolves
what only the launching machine knows: which Python has sglang (``sglang_python``) and whether the device
is ``cuda`` or ``cpu`` (``resolve_device``). The checkpoint watcher then keeps the servers on the newest
weights through ``/update_weights_from_disk`` (see docs/inference.md for the sidecar layout on a GPU pool).

On CPU (these machines' Xeons) SGLang runs on its plain-torch path from ``.venv-sglang`` (``make
sglang-venv``); each server gets ``inference.server_threads`` torch threads and passive OpenMP waits, so
an idle server leaves its cores to the trainer.

What it is not: an SGLang installation, and no multi-node placement (one launcher per node; the work
pool decides the nodes). SGLang takes its API key only as ``--api-key`` on the command line; logs show
it redacted.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

from infra.servers import ServerGroup, free_port, start_servers
from rollflow.api.config import InferenceConfig
from rollflow.api.errors import ServerStartupError
from rollflow.inference.sglang import cpu_threads_env, sglang_command
from rollflow.inference.vllm import resolve_python

logger = logging.getLogger(__name__)

SGLANG_VENV_PYTHON = ".venv-sglang/bin/python"  # `make sglang-venv`, relative to the repository root


def sglang_python(cfg: InferenceConfig) -> str:
    """The interpreter that runs SGLang: ``inference.sglang.python`` (relative to the repository root), else
    this one when it has sglang, else ``.venv-sglang``'s. Raises ``ServerStartupError`` saying how to get
    one when none exists."""
    given = cfg.sglang.python
    if given is not None:
        py = resolve_python(given)
        if not py.exists() and "/" in given:
            raise ServerStartupError(
                f"SGLang's Python {py} does not exist (inference.sglang.python = {given!r}): run `make "
                "sglang-venv` to build .venv-sglang (SGLang's CPU server), or point inference.sglang.python "
                "at a Python that has sglang installed"
            )
        return str(py)
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    venv = resolve_python(SGLANG_VENV_PYTHON)
    if venv.exists():
        return str(venv)
    raise ServerStartupError(
        "inference.backend is sglang, but this Python has no sglang and .venv-sglang does not exist: run "
        "`make sglang-venv` (SGLang's CPU server, about 3 minutes and 3.3 GB), install sglang here (GPU "
        "machines: the GPU image has it), or set inference.sglang.python"
    )


def resolve_device(cfg: InferenceConfig) -> str:
    """``inference.sglang.device``, with ``auto`` read on this machine: cuda when torch sees a GPU, else cpu."""
    if cfg.sglang.device != "auto":
        return cfg.sglang.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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

    Ports: ``cfg.base_port + i`` or free ports; on GPUs server i gets ``--base-gpu-id
    cfg.sglang.base_gpu_id + i * tp_size``. ``dtype`` (the model's) is used unless ``inference.sglang.dtype``
    is set. Raises ``ServerStartupError`` with the failing server's log tail.
    """
    sg = cfg.sglang
    python = sglang_python(cfg)
    device = resolve_device(cfg)
    version = weight_version if weight_version is not None else cfg.initial_weight_version
    n = cfg.n_servers if isinstance(cfg.n_servers, int) else 1
    ports = (
        [cfg.base_port + i for i in range(n)] if cfg.base_port else [free_port(cfg.host) for _ in range(n)]
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
            python=python,
            device=device,
            pause_mode=cfg.update_pause_mode,
        )
        for i, p in enumerate(ports)
    ]
    full_env = {**(cpu_threads_env(cfg) if device == "cpu" else {}), **(env or {})}
    group = start_servers(
        commands,
        [f"{cfg.host}:{p}" for p in ports],
        env=full_env,
        log_dir=log_dir,
        shutdown_timeout_s=cfg.shutdown_timeout_s,
        name="sglang",
    )
    try:
        group.wait_healthy(sg.startup_timeout_s)
    except BaseException:
        group.stop(timeout_s=cfg.shutdown_timeout_s)
        raise
    logger.info("SGLang servers ready (%s): %s", device, ", ".join(group.addresses))
    return group
