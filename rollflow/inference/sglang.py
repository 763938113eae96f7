"""The SGLang-protocol engines: ``SGLangEngine`` (SGLang on GPUs) and ``LocalEngine`` (rollflow's CPU server).

What it is: the ``Engine`` contract over SGLang 0.5.23's native HTTP API (``sglang_protocol``):

- generate: ``POST /generate`` with ``input_ids`` (a list of lists for a batch), per-token logprobs in
  ``meta_info.output_token_logprobs`` and versions in ``meta_info.weight_versions`` spans;
- pause: ``/pause_generation {"mode": abort | retract | in_place}``; resume: ``/continue_generation``;
- weights: ``/update_weights_from_disk {"model_path", "weight_version", "flush_cache"}``, with
  ``flush_cache`` false after an ``in_place`` pause and true otherwise: SGLang refuses to flush while
  requests are kept running (``in_place``) and answers 400, **yet the new weights are live** (its
  scheduler tags new tokens with the new version; only ``/model_info`` keeps the old one). Should that
  half-applied reply still come (a pause this engine did not make), ``load_weights`` aligns the reported
  version with ``/update_weight_version`` and returns: the record is never behind the served weights. Any
  other refusal ("Failed to get weights iterator", "... Rolling back to original weights") leaves the old
  weights served and raises ``WeightUpdateError``. Before any of this, ``check_loadable`` compares the
  directory's headers with the served model's: SGLang 0.5.23 copies tensor by tensor into the live
  model, and a tensor of another shape crashes its scheduler (its rollback raises again) and the whole
  server with it. The CPU server verifies the directory itself as well;
- version: ``/model_info``'s ``weight_version``; abort: ``/abort_request`` with an exact rid (SGLang ignores a
  rid no request has exactly, then aborts every rid that starts with it);
- launch: ``python -m sglang.launch_server ...`` (``sglang_command``: server i on GPUs
  ``base_gpu_id + i * tp_size``; on ``device cpu`` the flags of SGLang's plain-torch CPU path) or
  ``python -m infra.cpu_server ...`` (``cpu_server_command``).

SGLang takes its API key only as ``--api-key`` on the command line (logs show it redacted); the CPU server
reads it from ``$ROLLFLOW_INFERENCE_API_KEY``.

What it is not: no HTTP session, retries or routing (``client.py``), no process spawning (``infra/``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollflow.api.config import INFERENCE_API_KEY_ENV as API_KEY_ENV
from rollflow.api.config import InferenceConfig, SGLangConfig
from rollflow.api.errors import InferenceError, InvalidRequestError, ServerUnavailableError, WeightUpdateError
from rollflow.api.inference import SamplingParams
from rollflow.inference.checkpoint_check import check_loadable, tensor_index
from rollflow.inference.contract import EngineName, HttpCall, LaunchArgs, LaunchSpec
from rollflow.inference.routing import control_call, health_ok
from rollflow.inference.sglang_protocol import (
    PAUSE_MODES,
    ROUTE_ABORT,
    ROUTE_CONTINUE,
    ROUTE_GENERATE,
    ROUTE_MODEL_INFO,
    ROUTE_PAUSE,
    ROUTE_UPDATE_WEIGHT_VERSION,
    ROUTE_UPDATE_WEIGHTS,
    GenerateOutput,
    UpdateWeightFromDiskReqInput,
    build_generate_payload,
    parse_generate_response,
    update_was_applied,
)

logger = logging.getLogger(__name__)

# SGLang's CPU path (0.5.23, measured on these machines' Xeons): plain torch, no CUDA graphs, a bounded KV pool.
CPU_ATTENTION_BACKEND = "torch_native"
CPU_MEM_FRACTION_STATIC = 0.2
CPU_MAX_TOTAL_TOKENS = 65536

__all__ = [
    "API_KEY_ENV", "LocalEngine", "SGLangEngine", "cpu_server_command", "cpu_threads_env", "sglang_command",
]  # fmt: skip


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
    python: str | None = None,
    device: str | None = None,
    pause_mode: str | None = None,
) -> list[str]:
    """``[python, -m, sglang.launch_server, --model-path, ..., --host, ..., --port, ..., --tp-size, ...]``.

    ``python``: the interpreter (default ``sglang.python``, else this one); ``device``: ``cuda`` or ``cpu``
    (default ``sglang.device``, ``auto`` read as ``cuda``: the launcher resolves it on its machine). On
    ``cpu`` it adds ``--device cpu --attention-backend torch_native --disable-cuda-graph`` and bounds the
    memory (``--mem-fraction-static 0.2 --max-total-tokens 65536`` unless set). Other optional flags appear
    only when set (``--mem-fraction-static``, ``--max-total-tokens``, ``--attention-backend``, ``--api-key``,
    ``--weight-version``, ``--base-gpu-id``, ``--dtype``); ``sglang.extra_args`` come last, verbatim, so
    they can override.

    ``pause_mode`` (``inference.update_pause_mode``) ``in_place`` adds ``--disable-overlap-schedule``: with
    SGLang 0.5.23's overlap scheduler, the token whose forward pass was in flight when an ``in_place`` pause
    froze the scheduler is appended after the version change, so one token per running request per update
    is tagged with the new version although the old weights made it (measured: 64 of 64 requests; 0 of 64
    without overlap). ``retract`` and ``abort`` drain that result first and tag every token right.
    """
    sg = sglang or SGLangConfig()
    dev = device or (sg.device if sg.device != "auto" else "cuda")
    cmd = [
        python or sg.python or sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_path),
        "--host", host,
        "--port", str(port),
        "--tp-size", str(sg.tp_size),
    ]  # fmt: skip
    cpu = dev == "cpu"
    mem = (
        sg.mem_fraction_static
        if sg.mem_fraction_static is not None
        else (CPU_MEM_FRACTION_STATIC if cpu else None)
    )
    tokens = (
        sg.max_total_tokens if sg.max_total_tokens is not None else (CPU_MAX_TOTAL_TOKENS if cpu else None)
    )
    attention = sg.attention_backend or (CPU_ATTENTION_BACKEND if cpu else None)
    if cpu:
        cmd += ["--device", "cpu", "--disable-cuda-graph"]
    if attention is not None:
        cmd += ["--attention-backend", attention]
    if mem is not None:
        cmd += ["--mem-fraction-static", str(mem)]
    if tokens is not None:
        cmd += ["--max-total-tokens", str(tokens)]
    if api_key:
        cmd += ["--api-key", api_key]
    if weight_version is not None:
        cmd += ["--weight-version", weight_version]
    if pause_mode == "in_place":
        cmd += ["--disable-overlap-schedule"]
    if base_gpu_id is not None and not cpu:
        cmd += ["--base-gpu-id", str(base_gpu_id)]
    dtype = sg.dtype or dtype
    if dtype is not None:
        cmd += ["--dtype", dtype]
    return cmd + list(sg.extra_args)


def cpu_threads_env(cfg: InferenceConfig) -> dict[str, str]:
    """The environment of a server on CPU cores (rollflow's CPU server, SGLang on ``device cpu``):
    ``inference.server_threads`` torch threads, passive OpenMP waits (a waiting server leaves its cores to
    the trainer), offline hub."""
    threads = str(cfg.server_threads if isinstance(cfg.server_threads, int) else 1)
    return {
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    }


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
    batches_one_prompt_only = False
    verifies_on_load = False  # SGLang reads the directory itself: the watcher verifies it first

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

    def __init__(self) -> None:
        self._paused_mode: dict[str, str] = {}  # address -> the mode of the pause this engine put in force
        self._lock = threading.Lock()

    def pause(self, address: str, mode: str, *, api_key: str | None, timeout_s: float) -> None:
        control_call(address, ROUTE_PAUSE, {"mode": mode}, api_key=api_key, timeout_s=timeout_s)
        with self._lock:
            self._paused_mode[address] = mode

    def resume(self, address: str, *, api_key: str | None, timeout_s: float) -> None:
        control_call(address, ROUTE_CONTINUE, {}, api_key=api_key, timeout_s=timeout_s)
        with self._lock:
            self._paused_mode.pop(address, None)

    def load_weights(
        self,
        address: str,
        path: str | Path,
        version: str,
        *,
        api_key: str | None,
        timeout_s: float,
        commit: Mapping[str, Any] | None = None,
    ) -> None:
        """``/update_weights_from_disk`` with the ``flush_cache`` the pause in force allows (see the module
        docstring): false after ``in_place`` (its kept requests make SGLang refuse any flush), else true so
        that no prefix cached under the old weights is reused."""
        with self._lock:
            mode = self._paused_mode.get(address)
        self.check_before_load(address, path, api_key=api_key, timeout_s=timeout_s)
        body = UpdateWeightFromDiskReqInput(
            model_path=str(path), weight_version=version, flush_cache=mode != "in_place",
            commit=dict(commit) if commit is not None and self.verifies_on_load else None,
        ).to_json()  # fmt: skip
        try:
            reply = control_call(address, ROUTE_UPDATE_WEIGHTS, body, api_key=api_key, timeout_s=timeout_s)
        except ServerUnavailableError:
            raise
        except InferenceError as e:
            reply = e.reply  # the server's JSON reply, when there was one (routing.control_call)
            msg = str(reply.get("message")) if isinstance(reply, dict) else str(e)
            if update_was_applied(msg):  # the weights are live; make /model_info say so too
                control_call(
                    address, ROUTE_UPDATE_WEIGHT_VERSION, {"new_version": version, "abort_all_requests": False},
                    api_key=api_key, timeout_s=timeout_s,
                )  # fmt: skip
                logger.warning(
                    "%s: weights v%s are served, but their cache was not flushed (requests kept running): "
                    "prefixes cached under the old weights may be reused until evicted", address, version,
                )  # fmt: skip
                return
            raise WeightUpdateError(f"update refused: {msg}") from None
        if not (isinstance(reply, dict) and reply.get("success")):
            raise WeightUpdateError(f"update refused: {reply}")

    def check_before_load(
        self, address: str, path: str | Path, *, api_key: str | None, timeout_s: float
    ) -> None:
        """Refuse a directory SGLang would choke on: its headers against the served model's (or, when that
        directory is not visible from here, the files' own integrity)."""
        if (Path(path) / "adapter_config.json").is_file():
            return  # a LoRA adapter: only rollflow's CPU server loads these through this route, and checks them
        served = self._served_dir(address, api_key=api_key, timeout_s=timeout_s)
        if served is not None:
            check_loadable(path, served)
        else:  # another host, or pruned from the cache
            tensor_index(Path(path))

    def _served_dir(self, address: str, *, api_key: str | None, timeout_s: float) -> Path | None:
        """The served checkpoint's directory (``/model_info``'s ``model_path``) when it is one on this host."""
        info = control_call(address, ROUTE_MODEL_INFO, api_key=api_key, timeout_s=min(timeout_s, 30.0))
        path = info.get("model_path") if isinstance(info, dict) else None
        return Path(path) if isinstance(path, str) and Path(path).is_dir() else None

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
            pause_mode=cfg.update_pause_mode,
        )  # fmt: skip
        return LaunchSpec(cmd)


class LocalEngine(SGLangEngine):
    """rollflow's CPU server: SGLang's protocol, launched as ``python -m infra.cpu_server``."""

    name: EngineName = "local"
    verifies_on_load = True  # infra/cpu_server/weights.py: each weight file hashed as it is read

    def check_before_load(
        self, address: str, path: str | Path, *, api_key: str | None, timeout_s: float
    ) -> None:
        """Nothing here: the CPU server checks every directory itself before it swaps (full checkpoints
        against the served model, LoRA adapters against their base: ``infra/cpu_server/weights.py``)."""

    def launch(self, args: LaunchArgs) -> LaunchSpec:
        cfg = args.cfg
        env = cpu_threads_env(cfg)
        cmd = cpu_server_command(
            args.model_path, port=args.port, host=cfg.host, max_batch_size=cfg.max_batch_size,
            threads=int(env["OMP_NUM_THREADS"]), weight_version=args.version,
        )  # fmt: skip
        if cfg.api_key:
            env[API_KEY_ENV] = cfg.api_key
        return LaunchSpec(cmd, env)
