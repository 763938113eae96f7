"""``inference``: the servers (CPU server, vLLM, SGLang or external), the client and the checkpoint watcher;
``inference.sglang`` and ``inference.vllm``.

What it is not: the servers or the client (``rollflow/inference/``, ``infra/``); only the fields, their
single-section checks and the environment variables they fall back on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollflow.api.config.fields import check, help_

# Where launched servers, the watcher and clients read the inference API key when the config has none.
INFERENCE_API_KEY_ENV = "ROLLFLOW_INFERENCE_API_KEY"
INFERENCE_WEIGHTS_ROOTS_ENV = "ROLLFLOW_WEIGHTS_ROOTS"  # directories a CPU server may load weights from


@dataclass
class SGLangConfig:
    python: str | None = field(
        default=None,
        metadata=help_(
            "Python executable that has sglang installed. None: the running interpreter when it has sglang, "
            "else .venv-sglang/bin/python (`make sglang-venv` builds SGLang's CPU server there); a relative "
            "path is resolved against the repository root."
        ),
    )
    tp_size: int = field(default=1, metadata=help_("Tensor parallel size per server (--tp-size)."))
    device: Literal["auto", "cuda", "cpu"] = field(
        default="auto",
        metadata=help_(
            "--device. auto: cuda when the launching machine sees a CUDA GPU, else cpu. On cpu the launcher "
            "adds what SGLang's plain-torch CPU path needs: --attention-backend torch_native, "
            "--disable-cuda-graph, and the memory flags below (docs/inference.md, SGLang on CPU)."
        ),
    )
    attention_backend: str | None = field(
        default=None,
        metadata=help_("--attention-backend; None: SGLang's choice on GPUs, torch_native on cpu."),
    )
    dtype: str | None = field(
        default=None,
        metadata=help_(
            "--dtype; None: model.dtype (SGLang would otherwise serve a float32 model as float16 on cpu)."
        ),
    )
    mem_fraction_static: float | None = field(
        default=None,
        metadata=help_(
            "--mem-fraction-static: the share of the device's memory for weights and KV cache. None: "
            "SGLang's default on GPUs, 0.2 on cpu. Beside a trainer on the same GPU, size it with "
            "`rollflow plan` (docs/gpu.md)."
        ),
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata=help_(
            "--max-total-tokens (the KV pool). None: SGLang's sizing from mem_fraction_static on GPUs, "
            "65536 on cpu (without it the pool takes 4.2 GB there)."
        ),
    )
    extra_args: list[str] = field(
        default_factory=list, metadata=help_("Extra launch_server arguments, passed verbatim.")
    )
    startup_timeout_s: float = field(
        default=600.0,
        metadata=help_("How long to wait for /health after launch or a supervisor restart (30-40 s on cpu)."),
    )
    base_gpu_id: int = field(
        default=0,
        metadata=help_("GPU of the first server; server i gets --base-gpu-id base_gpu_id + i * tp_size."),
    )

    def __post_init__(self) -> None:
        check(
            self.python is None or self.python.strip() != "", "inference.sglang.python", "must name a Python"
        )
        check(self.tp_size >= 1, "inference.sglang.tp_size", "must be >= 1")
        check(
            self.mem_fraction_static is None or 0 < self.mem_fraction_static < 1,
            "inference.sglang.mem_fraction_static",
            "must be between 0 and 1 (the share of the device's memory)",
        )
        check(
            self.max_total_tokens is None or self.max_total_tokens >= 256,
            "inference.sglang.max_total_tokens",
            "must be >= 256 tokens",
        )
        check(self.startup_timeout_s > 0, "inference.sglang.startup_timeout_s", "must be > 0")


@dataclass
class VLLMConfig:
    python: str = field(
        default=".venv-vllm/bin/python",
        metadata=help_(
            "Python executable that has vLLM installed (a relative path is resolved against the repository "
            "root; `make vllm-venv` builds the default, vLLM's CPU build, in its own venv)."
        ),
    )
    dtype: str = field(default="auto", metadata=help_("--dtype (float32 for the tiny CPU models)."))
    max_model_len: int | None = field(
        default=None, metadata=help_("--max-model-len; None keeps the model's context length.")
    )
    max_num_seqs: int | None = field(
        default=None, metadata=help_("--max-num-seqs; None = inference.max_batch_size.")
    )
    enforce_eager: bool = field(
        default=False, metadata=help_("--enforce-eager (no CUDA graphs / compilation; on for tiny CPU runs).")
    )
    cpu_kvcache_space_gib: int = field(
        default=1, metadata=help_("CPU build: KV cache size in GiB ($VLLM_CPU_KVCACHE_SPACE).")
    )
    expose_control_endpoints: bool = field(
        default=False,
        metadata=help_(
            "Allow a non-loopback inference.host. vLLM's --api-key guards only /v1, /v2 and /inference; "
            "the dev-mode control routes rollflow needs (/pause, /resume, /collective_rpc, "
            "/update_weight_version) answer anyone who reaches the port, so put the server behind a "
            "network policy and set inference.api_key before turning this on."
        ),
    )
    base_gpu_id: int | None = field(
        default=None,
        metadata=help_(
            "GPUs: server i runs on GPUs base_gpu_id + i * tp_size onward (CUDA_VISIBLE_DEVICES; vLLM has no "
            "--base-gpu-id). None: no placement (the CPU build; on GPUs every server would share cuda:0). "
            "Beside an embedded trainer on GPU 0, set 1."
        ),
    )
    tp_size: int = field(default=1, metadata=help_("--tensor-parallel-size: GPUs per server."))
    extra_args: list[str] = field(
        default_factory=list, metadata=help_("Extra api_server arguments, passed verbatim (last).")
    )
    startup_timeout_s: float = field(
        default=300.0,
        metadata=help_("How long to wait for /health after launch (about 60 s on 2 CPU cores)."),
    )

    def __post_init__(self) -> None:
        check(self.python.strip() != "", "inference.vllm.python", "must name a Python executable")
        check(self.cpu_kvcache_space_gib >= 1, "inference.vllm.cpu_kvcache_space_gib", "must be >= 1")
        check(self.base_gpu_id is None or self.base_gpu_id >= 0, "inference.vllm.base_gpu_id", "must be >= 0")
        check(self.tp_size >= 1, "inference.vllm.tp_size", "must be >= 1")
        check(self.startup_timeout_s > 0, "inference.vllm.startup_timeout_s", "must be > 0")


@dataclass
class InferenceConfig:
    backend: Literal["local", "vllm", "sglang", "external"] = field(
        default="local",
        metadata=help_(
            "local: rollflow's CPU server (SGLang protocol); vllm: launch vLLM servers (the CPU build here, "
            "the CUDA build on GPUs); sglang: launch SGLang servers; external: servers already running at "
            "`addresses` (they speak SGLang's protocol unless inference.engine says vllm)."
        ),
    )
    engine: Literal["auto", "local", "vllm", "sglang"] = field(
        default="auto",
        metadata=help_(
            "The protocol the client and watcher speak (docs/inference.md). auto: the backend's (external: "
            "sglang's)."
        ),
    )
    n_servers: int | Literal["auto"] = field(
        default=1,
        metadata=help_(
            "Servers to launch (local, sglang). auto (backend local): one server, sized by server_threads "
            "(rollflow.configuration.layout)."
        ),
    )
    addresses: list[str] = field(
        default_factory=list, metadata=help_("host:port of each server for backend=external.")
    )
    host: str = field(
        default="127.0.0.1",
        metadata=help_("Bind address of launched servers. Keep loopback unless you set api_key."),
    )
    base_port: int = field(default=0, metadata=help_("First port of launched servers (0 = pick free ports)."))
    api_key: str | None = field(
        default=None,
        metadata=help_(
            "Bearer key required by the servers (None = no auth). Prefer ROLLFLOW_INFERENCE_API_KEY.",
            secret=True,
        ),
    )
    max_batch_size: int = field(
        default=64, metadata=help_("CPU server: max sequences decoded together (continuous batching).")
    )
    server_threads: int | Literal["auto"] = field(
        default=1,
        metadata=help_(
            "CPU server: torch threads per server. auto: the cores the trainer (train.threads) leaves, split "
            "over the servers, resolved on the machine that loads the config. Evidence for 1: on 2 cores, 2 "
            "threads made the server busier and the run no faster (docs/benchmarks.md, 'Server threads "
            "above the free cores, measured again')."
        ),
    )
    request_timeout_s: float = field(default=120.0, metadata=help_("Timeout of one /generate call."))
    connect_timeout_s: float = field(default=5.0, metadata=help_("TCP connect timeout."))
    max_retries: int = field(default=3, metadata=help_("Retries per request before failing over."))
    retry_backoff_s: float = field(default=0.5, metadata=help_("Base of the exponential backoff."))
    affinity_lru_size: int = field(
        default=4096, metadata=help_("Remembered rid -> server assignments (multi-turn affinity).")
    )
    poll_interval_s: float = field(
        default=1.0,
        metadata=help_(
            "How often the checkpoint watcher reads LATEST in full (on S3: its request rate). An in-process"
            " publish (embedded mode) wakes it at once."
        ),
    )
    local_poll_interval_s: float = field(
        default=0.02,
        metadata=help_(
            "Local storage root: the watcher stats checkpoints/LATEST this often between full polls (one"
            " syscall), so a version published by another process is seen within it. 0 = off."
        ),
    )
    update_pause_mode: str = field(
        default="retract",
        metadata=help_(
            "How a weight update pauses a server (SGLang's /pause_generation mode; default retract, measured "
            "faster: docs/benchmarks.md, 'Where the time goes'). abort: in-flight "
            "requests return their partial output and the client re-submits prompt + output so far (one "
            "HTTP round trip and one prefill per interrupted request); retract: the server keeps them, "
            "recomputes their KV cache under the new weights and continues (the same tokens and version "
            "spans as abort, without the round trips); in_place: the server keeps them and their KV cache "
            "from the old weights (cheapest; the tokens after the update attend to stale keys/values)."
        ),
    )
    initial_weight_version: str = field(
        default="0",
        metadata=help_(
            "weight_version that launched servers report for model.path (SGLang's --weight-version)."
        ),
    )
    startup_timeout_s: float = field(
        default=120.0, metadata=help_("CPU server: how long to wait for /health after launch.")
    )
    shutdown_timeout_s: float = field(
        default=15.0, metadata=help_("Launched servers get SIGTERM, then SIGKILL after this many seconds.")
    )
    weight_update_timeout_s: float = field(
        default=600.0,
        metadata=help_(
            "Watcher: timeout of one /update_weights_from_disk call (the server loads the weights)."
        ),
    )
    max_restarts: int = field(
        default=3,
        metadata=help_(
            "Launched servers (local, sglang) are supervised: one that dies is restarted on its address "
            "up to this many times, then dropped from routing with a ServerLostError in the log (the "
            "rollout fails once no server is left). 0 = drop at the first death."
        ),
    )
    supervise_interval_s: float = field(
        default=0.5, metadata=help_("How often the supervisor checks that launched servers are alive.")
    )
    dead_server_timeout_s: float = field(
        default=60.0,
        metadata=help_(
            "The rollout fails when no inference server has answered the watcher's checks for this long "
            "(servers nobody restarts, e.g. backend=external)."
        ),
    )
    sglang: SGLangConfig = field(default_factory=SGLangConfig, metadata=help_("SGLang launcher."))
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata=help_("vLLM launcher."))

    def __post_init__(self) -> None:
        check(self.n_servers == "auto" or self.n_servers >= 1, "inference.n_servers", "must be >= 1 or auto")
        check(
            self.server_threads == "auto" or self.server_threads >= 1,
            "inference.server_threads",
            "must be >= 1 or auto",
        )
        if self.backend == "external":
            check(
                len(self.addresses) > 0,
                "inference.addresses",
                "must list host:port of each server when inference.backend=external",
            )
        check(self.request_timeout_s > 0, "inference.request_timeout_s", "must be > 0")
        check(self.max_retries >= 0, "inference.max_retries", "must be >= 0")
        check(self.poll_interval_s > 0, "inference.poll_interval_s", "must be > 0")
        check(self.local_poll_interval_s >= 0, "inference.local_poll_interval_s", "must be >= 0 (0 = off)")
        check(
            self.update_pause_mode in ("abort", "retract", "in_place"),
            "inference.update_pause_mode",
            f"must be abort, retract or in_place, got {self.update_pause_mode!r}",
        )
        check(self.max_batch_size >= 1, "inference.max_batch_size", "must be >= 1")
        check(0 <= self.base_port < 65536, "inference.base_port", "must be a port number or 0")
        check(self.initial_weight_version != "", "inference.initial_weight_version", "must not be empty")
        check(self.startup_timeout_s > 0, "inference.startup_timeout_s", "must be > 0")
        check(self.shutdown_timeout_s > 0, "inference.shutdown_timeout_s", "must be > 0")
        check(self.max_restarts >= 0, "inference.max_restarts", "must be >= 0 (0 = never restart)")
        check(self.supervise_interval_s > 0, "inference.supervise_interval_s", "must be > 0")
        check(self.dead_server_timeout_s > 0, "inference.dead_server_timeout_s", "must be > 0")
