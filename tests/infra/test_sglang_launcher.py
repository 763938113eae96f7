"""The SGLang launcher: the exact command it builds from the config, the Python it picks, and a launch that
fails with the server's own log tail (against SGLang's real server from ``.venv-sglang``).

The launch, health wait, weight loads, restarts and stop against the real server are in
tests/inference/test_sglang_engine.py (one session server).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra.servers import redact_command
from infra.sglang_launcher import SGLANG_VENV_PYTHON, launch_sglang_servers, sglang_python
from rollflow.api.config import InferenceConfig, SGLangConfig
from rollflow.api.errors import ServerStartupError
from rollflow.inference.sglang import sglang_command


def test_command_has_model_host_port_tp_and_nothing_unset() -> None:
    cmd = sglang_command("/models/qwen", port=30001, host="0.0.0.0")
    assert cmd == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "/models/qwen",
        "--host", "0.0.0.0", "--port", "30001", "--tp-size", "1",
    ]  # fmt: skip


def test_command_with_every_option() -> None:
    sg = SGLangConfig(
        python="/opt/venv/bin/python",
        tp_size=2,
        mem_fraction_static=0.8,
        extra_args=["--log-level", "warning"],
    )
    cmd = sglang_command(
        "/m", port=1, sglang=sg, api_key="k", weight_version="7", base_gpu_id=2, dtype="bfloat16"
    )
    assert cmd == [
        "/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
        "--port", "1", "--tp-size", "2", "--mem-fraction-static", "0.8", "--api-key", "k",
        "--weight-version", "7", "--base-gpu-id", "2", "--dtype", "bfloat16", "--log-level", "warning",
    ]  # fmt: skip
    assert "k" not in redact_command(cmd)[redact_command(cmd).index("--api-key") + 1]


def test_cpu_command_takes_its_flags_from_the_config() -> None:
    cmd = sglang_command("/m", port=1, sglang=SGLangConfig(device="cpu"), base_gpu_id=3, dtype="float32")
    assert cmd[cmd.index("--tp-size") + 2 :] == [
        "--device", "cpu", "--disable-cuda-graph", "--attention-backend", "torch_native",
        "--mem-fraction-static", "0.2", "--max-total-tokens", "65536", "--dtype", "float32",
    ]  # fmt: skip
    sg = SGLangConfig(device="cpu", max_total_tokens=8192, attention_backend="sdpa", dtype="bfloat16")
    cmd = sglang_command("/m", port=1, sglang=sg, dtype="float32")
    assert (
        cmd[cmd.index("--max-total-tokens") + 1] == "8192"
        and cmd[cmd.index("--attention-backend") + 1] == "sdpa"
    )
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"  # inference.sglang.dtype wins over the model's


def test_in_place_pause_turns_the_overlap_scheduler_off() -> None:
    assert "--disable-overlap-schedule" in sglang_command("/m", port=1, pause_mode="in_place")
    for mode in ("retract", "abort", None):
        assert "--disable-overlap-schedule" not in sglang_command("/m", port=1, pause_mode=mode)


def test_the_python_is_the_configured_one_else_one_with_sglang(tmp_path: Path) -> None:
    assert (
        sglang_python(InferenceConfig(sglang=SGLangConfig(python="/usr/bin/python3"))) == "/usr/bin/python3"
    )
    with pytest.raises(ServerStartupError, match="make sglang-venv"):
        sglang_python(InferenceConfig(sglang=SGLangConfig(python=str(tmp_path / "nope/bin/python"))))
    # the test venv has no sglang: the default is .venv-sglang's (make test builds it)
    from rollflow.inference.vllm import resolve_python

    assert sglang_python(InferenceConfig()) == str(resolve_python(SGLANG_VENV_PYTHON))


@pytest.mark.slow
def test_launch_failure_reports_the_log_tail(tmp_path: Path) -> None:
    """The real server, given a directory that holds no model: a ServerStartupError ending in its log."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    cfg = InferenceConfig(backend="sglang", sglang=SGLangConfig(startup_timeout_s=120))
    with pytest.raises(ServerStartupError, match="config.json"):
        launch_sglang_servers(cfg, empty, log_dir=tmp_path / "logs")
