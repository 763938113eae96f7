"""The SGLang-protocol engines: ``SGLangEngine`` (SGLang on GPUs) and ``LocalEngine`` (rollflow's CPU server).

What it is: the ``Engine`` contract over SGLang 0.5.23's native HTTP API (``sglang_protocol``):

- generate: ``POST /generate`` with ``input_ids`` (a list of lists for a batch), per-token logprobs in
  ``meta_info.output_token_logprobs`` and versions in ``meta_info.weight_versions`` spans;
- pause: ``/pause_generation {"mode": abort | retract | in_place}``; resume: ``/continue_generation``;
- weights: ``/update_weights_from_disk {"model_path", "weight_version"}``; SGLang loads into a fresh
  buffer and keeps the old weights when it fails; the CPU server verifies the directory first;
- version: ``/get_model_info``'s ``weight_version``; abort: ``/abort_request`` (prefix match on rid);
- launch: ``python -m sglang.launch_server ...`` (``sglang_command``, server i on GPUs
  ``base_gpu_id + i * tp_size``) or ``python -m infra.cpu_server ...`` (``cpu_server_command``).

SGLang takes its API key only as ``--api-key`` on the command line (logs show it redacted); the CPU server
reads it from ``$ROLLFLOW_INFERENCE_API_KEY``.

What it is not: no HTTP session, retries or routing (``client.py``), no process spawning (``infra/``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from rollflow.api.config import INFERENCE_API_KEY_ENV as API_KEY_ENV
from rollflow.api.config import SGLangConfig
from rollflow.api.errors import InferenceError, InvalidRequestError, ServerUnavailableError, WeightUpdateError
from rollflow.api.inference import SamplingParams
from rollflow.inference.contract import EngineName, HttpCall, LaunchArgs, LaunchSpec
from rollflow.inference.routing import control_call, health_ok
from rollflow.inference.sglang_protocol import (
    PAUSE_MODES,
    ROUTE_ABORT,
    ROUTE_CONTINUE,
    ROUTE_GENERATE,
    ROUTE_MODEL_INFO,
    ROUTE_PAUSE,
    ROUTE_UPDATE_WEIGHTS,
    GenerateOutput,
    UpdateWeightFromDiskReqInput,
    build_generate_payload,
    parse_generate_response,
)

__all__ = ["API_KEY_ENV", "LocalEngine", "SGLangEngine", "cpu_server_command", "sglang_command"]


def sglang_command(
    model_path: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    sglang: SGLangConfig | None = None,
    api_key: str | None = None,
    weight_version: str | None = None,
    base_gpu_id: int | None = None,
    dtype: str | None = None,
) -> list[str]:
    """``[python, -m, sglang.launch_server, --model-path, ..., --host, ..., --port, ..., --tp-size, ...]``.

    Optional flags appear only when set (``--mem-fraction-static``, ``--api-key``, ``--weight-version``,
    ``--base-gpu-id``, ``--dtype``); ``sglang.extra_args`` come last, verbatim, so they can override.
    """
    sg = sglang or SGLangConfig()
    cmd = [
        sg.python, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", host,
        "--port", str(port),
        "--tp-size", str(sg.tp_size),
    ]  # fmt: skip
    if sg.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(sg.mem_fraction_static)]
    if api_key:
        cmd += ["--api-key", api_key]
    if weight_version is not None:
        cmd += ["--weight-version", weight_version]
    if base_gpu_id is not None:
        cmd += ["--base-gpu-id", str(base_gpu_id)]
    if dtype is not None:
        cmd += ["--dtype", dtype]
    return cmd + list(sg.extra_args)


def cpu_server_command(
    model_path: str | Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    max_batch_size: int = 64,
    threads: int = 1,
    weight_version: str = "0",
    extra_args: list[str] | tuple[str, ...] = (),
    python: str = sys.executable,
) -> list[str]:
    """``python -m infra.cpu_server ...`` for one server (the API key goes in the environment)."""
    return [
        python, "-m", "infra.cpu_server", "--model-path", str(model_path), "--host", host, "--port", str(port),
        "--max-batch-size", str(max_batch_size), "--threads", str(threads), "--weight-version", weight_version,
        *extra_args,
    ]  # fmt: skip


class SGLangEngine:
    """``Engine`` over SGLang's native protocol (see the module docstring)."""

    name: EngineName = "sglang"
    pause_modes: tuple[str, ...] = PAUSE_MODES
    batches = True

    def generate_call(
        self, tags: list[str], inputs: list[list[int]], sampling: SamplingParams, max_new_tokens: int
    ) -> HttpCall:
        sp = sampling
        payload = build_generate_payload(
            inputs[0], max_new_tokens=max_new_tokens, temperature=sp.temperature, top_p=sp.top_p,
            top_k=sp.top_k, min_p=sp.min_p, stop_token_ids=sp.stop_token_ids, ignore_eos=sp.ignore_eos,
            skip_special_tokens=sp.skip_special_tokens, sampling_seed=sp.sampling_seed, return_logprob=True,
        )  # fmt: skip
        if len(inputs) > 1:
            payload["input_ids"] = [list(x) for x in inputs]  # [n][P_i]
            payload["rid"] = list(tags)
        else:
            payload["rid"] = tags[0]
        return HttpCall(ROUTE_GENERATE, payload)

    def parse_generate(self, body: Any, n: int) -> list[GenerateOutput]:
        if n == 1:
            return [parse_generate_response(body)]
        if not isinstance(body, list) or len(body) != n:
            raise InvalidRequestError(f"a batch of {n} got {type(body).__name__} back, not {n} replies")
        return [parse_generate_response(item) for item in body]

    def abort_call(self, tags: list[str]) -> HttpCall:
        return HttpCall(ROUTE_ABORT, {"rid": tags[0]})  # one call per tag (the client loops)

    def pause(self, address: str, mode: str, *, api_key: str | None, timeout_s: float) -> None:
        control_call(address, ROUTE_PAUSE, {"mode": mode}, api_key=api_key, timeout_s=timeout_s)

    def resume(self, address: str, *, api_key: str | None, timeout_s: float) -> None:
        control_call(address, ROUTE_CONTINUE, {}, api_key=api_key, timeout_s=timeout_s)

    def load_weights(
        self, address: str, path: str | Path, version: str, *, api_key: str | None, timeout_s: float
    ) -> None:
        body = UpdateWeightFromDiskReqInput(model_path=str(path), weight_version=version).to_json()
        try:
            reply = control_call(address, ROUTE_UPDATE_WEIGHTS, body, api_key=api_key, timeout_s=timeout_s)
        except ServerUnavailableError:
            raise
        except InferenceError as e:
            reply = getattr(e, "reply", None)
            msg = reply.get("message") if isinstance(reply, dict) else str(e)
            raise WeightUpdateError(f"update refused: {msg}") from None
        if not (isinstance(reply, dict) and reply.get("success")):
            raise WeightUpdateError(f"update refused: {reply}")

    def served_version(self, address: str, *, api_key: str | None, timeout_s: float) -> str | None:
        info = control_call(address, ROUTE_MODEL_INFO, api_key=api_key, timeout_s=timeout_s)
        v = info.get("weight_version") if isinstance(info, dict) else None
        return None if v is None else str(v)

    def health(self, address: str, *, timeout_s: float = 2.0) -> bool:
        return health_ok(address, timeout_s=timeout_s)

    def launch(self, args: LaunchArgs) -> LaunchSpec:
        cfg, sg = args.cfg, args.cfg.sglang
        cmd = sglang_command(
            args.model_path, port=args.port, host=cfg.host, sglang=sg, api_key=cfg.api_key,
            weight_version=args.version, base_gpu_id=sg.base_gpu_id + args.index * sg.tp_size,
        )  # fmt: skip
        return LaunchSpec(cmd)


class LocalEngine(SGLangEngine):
    """rollflow's CPU server: SGLang's protocol, launched as ``python -m infra.cpu_server``."""

    name: EngineName = "local"

    def launch(self, args: LaunchArgs) -> LaunchSpec:
        cfg = args.cfg
        threads = cfg.server_threads if isinstance(cfg.server_threads, int) else 1
        cmd = cpu_server_command(
            args.model_path, port=args.port, host=cfg.host, max_batch_size=cfg.max_batch_size, threads=threads,
            weight_version=args.version,
        )  # fmt: skip
        env = {
            "OMP_NUM_THREADS": str(threads),
            # idle OpenMP threads sleep instead of spinning, so a waiting server leaves its cores to the trainer
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        }
        if cfg.api_key:
            env[API_KEY_ENV] = cfg.api_key
        return LaunchSpec(cmd, env)
