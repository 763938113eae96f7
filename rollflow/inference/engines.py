"""Which ``Engine`` implementation a config asks for.

What it is: ``engine_name(cfg)`` (``inference.engine``, or the backend's own: local -> local, vllm ->
vllm, sglang -> sglang, external -> sglang's protocol) and ``engine_for(name_or_cfg)``, a new instance.
What it is not: the engines themselves (``sglang.py``, ``vllm.py``) or their launchers (``infra/``).
"""

from __future__ import annotations

from rollflow.api.config import InferenceConfig
from rollflow.api.errors import ConfigError
from rollflow.inference.contract import ENGINE_NAMES, Engine
from rollflow.inference.sglang import LocalEngine, SGLangEngine
from rollflow.inference.vllm import VLLMEngine


def engine_name(cfg: InferenceConfig) -> str:
    if cfg.engine != "auto":
        return cfg.engine
    return "sglang" if cfg.backend == "external" else cfg.backend


def engine_for(spec: str | InferenceConfig) -> Engine:
    """A new ``Engine`` for ``"local"``, ``"vllm"`` or ``"sglang"``, or for an ``inference`` config."""
    name = engine_name(spec) if isinstance(spec, InferenceConfig) else spec
    if name == "local":
        return LocalEngine()
    if name == "sglang":
        return SGLangEngine()
    if name == "vllm":
        return VLLMEngine()
    raise ConfigError("inference.engine", f"unknown engine {name!r}; one of {', '.join(ENGINE_NAMES)}")
