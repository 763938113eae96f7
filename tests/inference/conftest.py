"""Fixtures of tests/inference: the CPU-server fixtures of tests/rollout/conftest.py, and ONE vLLM server.

The CPU-server fixtures (``tiny_model_dir``, ``tiny_model_dir_b``, ``cpu_server``, ``inference_lib``) are
re-bound from tests/rollout/conftest.py, so the session instances are shared.

``vllm_server`` is one vLLM server (``infra.vllm_launcher``, from ``.venv-vllm``: ``make vllm-venv``) for
the whole session, because it takes about a minute to start on 2 cores. It serves ``vllm_models.a`` as
weight_version "0" with API key ``VLLM_KEY``; a test may load other weights, but must leave it serving
``a`` as "0" (``vllm_lib.serve``) and unpaused. At teardown it checks that the stop was quiet (no
``EngineDeadError`` and no traceback in the server's log after the stop began) and left no files
(its scratch directory and ``vllm_dist_*``). The models have head size 32 (vLLM's CPU attention has no 16).

``sglang_server`` is ONE real SGLang server (``infra.sglang_launcher``, from ``.venv-sglang``: ``make
sglang-venv``; 30-40 s to start on 2 cores) on CPU for the whole session, serving ``vllm_models.a`` as
"0" with API key ``SGLANG_KEY``, the flags chosen by the launcher from the config (device auto -> cpu).
The same contract: a test may load other weights but leaves it serving ``a`` as "0" (``sglang_lib.serve``)
and unpaused.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

# tests/ is on sys.path (tests/conftest.py's directory): tests/rollout/conftest.py imports as a module, whose
# session instances live in a process-wide holder, so every directory shares one model set and one server.
_shared = importlib.import_module("rollout.conftest")
tiny_model_dir = _shared.tiny_model_dir
tiny_model_dir_b = _shared.tiny_model_dir_b
cpu_server = _shared.cpu_server
inference_lib = _shared.inference_lib

VLLM_KEY = "test-vllm-key"
VLLM_ARCH = {"num_attention_heads": 2, "num_key_value_heads": 1}  # head size 64 / 2 = 32


def vllm_config(**overrides: Any) -> Any:
    from rollflow.api.config import InferenceConfig, VLLMConfig

    vc = VLLMConfig(dtype="float32", max_model_len=1024, enforce_eager=True, startup_timeout_s=300.0)
    return InferenceConfig(
        backend="vllm", n_servers=1, server_threads=2, api_key=VLLM_KEY, vllm=vc, **overrides
    )


@pytest.fixture(scope="session")
def vllm_models(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """``a`` and ``b``: same architecture, other weights; ``wide``: hidden size 128 (another architecture)."""
    root = tmp_path_factory.mktemp("vllm-models")
    write = _shared.write_tiny_model
    return SimpleNamespace(
        a=write(root / "a", seed=0, **VLLM_ARCH),
        b=write(root / "b", seed=1, **VLLM_ARCH),
        wide=write(root / "wide", seed=2, hidden_size=128, intermediate_size=256, **VLLM_ARCH),
    )


@pytest.fixture(scope="session")
def vllm_server(vllm_models: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from infra.vllm_launcher import launch_vllm_servers

    dist_before = set(Path(tempfile.gettempdir()).glob("vllm_dist_*"))
    log_dir = tmp_path_factory.mktemp("vllm-logs")
    group = launch_vllm_servers(vllm_config(), vllm_models.a, log_dir=log_dir)
    try:
        yield group
    finally:
        sizes = {s.log_path: s.log_path.stat().st_size for s in group.servers}
        group.stop(timeout_s=30)
        for log, start in sizes.items():
            tail = log.read_bytes()[start:].decode(errors="replace")
            assert "EngineDeadError" not in tail and "Traceback" not in tail, f"noisy stop:\n{tail[-3000:]}"
        assert group.scratch_dir is not None and not group.scratch_dir.exists()
        assert set(Path(tempfile.gettempdir()).glob("vllm_dist_*")) <= dist_before


def _serve_with(engine: Any, key: str, group: Any, model_dir: Path, version: str) -> None:
    """Load ``model_dir`` into every server of ``group`` as ``version`` (pause, load, resume)."""
    for a in group.addresses:
        engine.pause(a, "abort", api_key=key, timeout_s=30)
        try:
            engine.load_weights(a, model_dir, version, api_key=key, timeout_s=120)
        finally:
            engine.resume(a, api_key=key, timeout_s=30)


def _serve(group: Any, model_dir: Path, version: str) -> None:
    from rollflow.inference.vllm import VLLMEngine

    _serve_with(VLLMEngine(), VLLM_KEY, group, model_dir, version)


SGLANG_KEY = "test-sglang-key"


def sglang_config(**overrides: Any) -> Any:
    from rollflow.api.config import InferenceConfig, SGLangConfig

    return InferenceConfig(
        backend="sglang", n_servers=1, server_threads=2, api_key=SGLANG_KEY,
        sglang=SGLangConfig(startup_timeout_s=300.0), **overrides,
    )  # fmt: skip


@pytest.fixture(scope="session")
def sglang_server(vllm_models: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from infra.sglang_launcher import launch_sglang_servers

    log_dir = tmp_path_factory.mktemp("sglang-logs")
    group = launch_sglang_servers(sglang_config(), vllm_models.a, dtype="float32", log_dir=log_dir)
    try:
        yield group
    finally:
        group.stop(timeout_s=30)
        assert group.scratch_dir is not None and not group.scratch_dir.exists()


@pytest.fixture(scope="module")
def sglang_server_in_place(
    vllm_models: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A second server, launched for update_pause_mode in_place (so without SGLang's overlap scheduler)."""
    from infra.sglang_launcher import launch_sglang_servers

    log_dir = tmp_path_factory.mktemp("sglang-in-place-logs")
    group = launch_sglang_servers(
        sglang_config(update_pause_mode="in_place"), vllm_models.a, dtype="float32", log_dir=log_dir
    )
    try:
        yield group
    finally:
        group.stop(timeout_s=30)


def _serve_sglang(group: Any, model_dir: Path, version: str) -> None:
    from rollflow.inference.sglang import SGLangEngine

    _serve_with(SGLangEngine(), SGLANG_KEY, group, model_dir, version)


@pytest.fixture(scope="session")
def sglang_lib() -> SimpleNamespace:
    return SimpleNamespace(serve=_serve_sglang, config=sglang_config, KEY=SGLANG_KEY)


@pytest.fixture(scope="session")
def vllm_lib() -> SimpleNamespace:
    return SimpleNamespace(serve=_serve, config=vllm_config, KEY=VLLM_KEY)
