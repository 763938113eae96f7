"""The engine contract without a vLLM server: which engine a config picks, launch lines and their refusals,
the checkpoint header check, and vLLM's wire format on a recorded reply."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollflow.api.config import InferenceConfig, VLLMConfig
from rollflow.api.errors import ConfigError, ServerStartupError, WeightUpdateError
from rollflow.api.inference import SamplingParams
from rollflow.inference.checkpoint_check import check_loadable
from rollflow.inference.contract import Engine, LaunchArgs
from rollflow.inference.engines import engine_for, engine_name
from rollflow.inference.vllm import VLLMEngine


def test_the_backend_picks_the_engine() -> None:
    assert engine_name(InferenceConfig()) == "local"
    assert engine_name(InferenceConfig(backend="vllm")) == "vllm"
    assert engine_name(InferenceConfig(backend="external", addresses=["h:1"])) == "sglang"
    assert engine_name(InferenceConfig(backend="external", addresses=["h:1"], engine="vllm")) == "vllm"
    for name in ("local", "vllm", "sglang"):
        assert isinstance(engine_for(name), Engine) and engine_for(name).name == name
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        engine_for("tgi")


def test_vllm_launch_line_keeps_the_key_off_the_command_line() -> None:
    cfg = InferenceConfig(
        backend="vllm", api_key="s3cret", server_threads=2, vllm=VLLMConfig(max_model_len=64)
    )
    spec = VLLMEngine().launch(LaunchArgs("/m", 4321, cfg))
    cmd = spec.command
    assert cmd[1:3] == ["-m", "infra.vllm_server"] and cmd[0].endswith(".venv-vllm/bin/python")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--max-model-len") + 1] == "64"
    assert "--enable-scale-out" in cmd and "s3cret" not in " ".join(cmd)
    assert spec.env["VLLM_API_KEY"] == "s3cret" and spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert spec.env["OMP_NUM_THREADS"] == "2" and spec.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_vllm_servers_on_gpus_each_get_their_own() -> None:
    """vLLM has no --base-gpu-id: server i gets CUDA_VISIBLE_DEVICES through infra.vllm_server --gpu-ids."""
    cfg = InferenceConfig(backend="vllm", n_servers=2, vllm=VLLMConfig(base_gpu_id=1, tp_size=2))
    cmds = [VLLMEngine().launch(LaunchArgs("/m", 1, cfg, i)).command for i in (0, 1)]
    assert [c[c.index("--gpu-ids") + 1] for c in cmds] == ["1,2", "3,4"]
    assert cmds[0][cmds[0].index("--tensor-parallel-size") + 1] == "2"
    assert (
        "--gpu-ids" not in VLLMEngine().launch(LaunchArgs("/m", 1, InferenceConfig(backend="vllm"))).command
    )


def test_vllm_server_wrapper_takes_its_gpu_ids_off_the_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.vllm_server import take_gpu_ids

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert take_gpu_ids(["x", "--model", "m", "--gpu-ids", "3,4", "--port", "1"]) == [
        "x",
        "--model",
        "m",
        "--port",
        "1",
    ]
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,4"
    assert take_gpu_ids(["x", "--model", "m"]) == ["x", "--model", "m"]


def test_vllm_refuses_a_non_loopback_host_without_the_opt_in_and_a_key() -> None:
    eng = VLLMEngine()
    with pytest.raises(ConfigError, match="expose_control_endpoints"):
        eng.launch(LaunchArgs("/m", 1, InferenceConfig(backend="vllm", host="0.0.0.0", api_key="k")))
    exposed = VLLMConfig(expose_control_endpoints=True)
    with pytest.raises(ConfigError, match="inference.api_key"):
        eng.launch(LaunchArgs("/m", 1, InferenceConfig(backend="vllm", host="0.0.0.0", vllm=exposed)))
    cfg = InferenceConfig(backend="vllm", host="0.0.0.0", api_key="k", vllm=exposed)
    assert eng.launch(LaunchArgs("/m", 1, cfg)).command[5:7] == ["--host", "0.0.0.0"]


def test_a_missing_vllm_python_says_how_to_build_it(tmp_path: Path) -> None:
    from infra.vllm_launcher import launch_vllm_servers

    cfg = InferenceConfig(backend="vllm", vllm=VLLMConfig(python=str(tmp_path / "nope" / "python")))
    with pytest.raises(ServerStartupError, match="make vllm-venv"):
        launch_vllm_servers(cfg, tmp_path)


def test_vllm_cpu_build_refuses_head_size_16(tiny_model_dir: Path) -> None:
    from infra.vllm_launcher import check_cpu_head_size

    with pytest.raises(ServerStartupError, match="head size 16"):
        check_cpu_head_size(tiny_model_dir)


def test_vllm_wire_format() -> None:
    eng = VLLMEngine()
    call = eng.generate_call(
        ["ep-3"], [[5, 6]], SamplingParams(max_new_tokens=4, top_k=-1, sampling_seed=7), 3
    )
    assert call.route == "/inference/v1/generate" and call.payload["token_ids"] == [5, 6]
    sp = call.payload["sampling_params"]
    assert sp["max_tokens"] == 3 and sp["logprobs"] == 0 and sp["seed"] == 7 and "top_k" not in sp
    reply: dict[str, Any] = {
        "request_id": "generate-tokens-ep-3",
        "usage": {"prompt_tokens": 2},
        "choices": [
            {
                "finish_reason": "abort",
                "token_ids": [9, 8, 7],
                "weight_versions": [
                    {"version": "4", "start": 0, "end": 2},
                    {"version": "5", "start": 2, "end": 3},
                ],
                "logprobs": {"content": [{"token_id": t, "logprob": -0.5 * t} for t in (9, 8, 7)]},
            }
        ],
    }
    (out,) = eng.parse_generate(reply, 1)
    assert out.finish_type == "abort" and out.output_ids == [9, 8, 7]
    assert out.output_token_logprobs == [-4.5, -4.0, -3.5] and out.token_versions == ["4", "4", "5"]
    assert eng.abort_call(["ep-3-2"]).payload == {"request_ids": ["ep-3-2"]}


def test_check_loadable(
    inference_lib: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    check_loadable(tiny_model_dir_b, tiny_model_dir)  # same architecture, other weights
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir_b, truncated)
    f = truncated / "model.safetensors"
    os.truncate(f, f.stat().st_size - 1)
    with pytest.raises(WeightUpdateError, match="truncated or damaged"):
        check_loadable(truncated, tiny_model_dir)
    wide = inference_lib.write_tiny_model(tmp_path / "wide", hidden_size=128, intermediate_size=256)
    with pytest.raises(WeightUpdateError, match="has shape"):
        check_loadable(wide, tiny_model_dir)
    deeper = inference_lib.write_tiny_model(tmp_path / "deeper", num_hidden_layers=3)
    with pytest.raises(WeightUpdateError, match="unexpected"):
        check_loadable(deeper, tiny_model_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(WeightUpdateError, match="no \\*.safetensors"):
        check_loadable(empty, tiny_model_dir)


def test_the_quiet_stop_drops_only_the_engine_death_logged_during_shutdown() -> None:
    import logging

    from infra.vllm_server import QuietStop

    class EngineDeadError(Exception):  # vLLM's name; the filter matches by name (it runs in vLLM's venv)
        pass

    def record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("vllm.v1.engine.async_llm", logging.ERROR, __file__, 1, msg, (), info)

    quiet = QuietStop()
    death = record("AsyncLLM output_handler failed.", EngineDeadError("EngineCore encountered an issue"))
    assert quiet.filter(death)  # before a shutdown: a real fault, kept
    assert quiet.filter(record("[shutdown] MPClient: engine manager stopped"))
    assert not quiet.filter(death)
    assert quiet.filter(record("AsyncLLM output_handler failed.", RuntimeError("other")))
