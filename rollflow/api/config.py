"""The experiment configuration: one typed tree of dataclasses.

What it is: every knob of a rollflow run, with help text and defaults taken from the papers
(GRPO, DAPO's asymmetric clip, dual-clip PPO, AReaL's decoupled loss and staleness bound).
The tree is plain dataclasses so Prefect renders it as a form and YAML maps onto it one to one.
Loading, overrides and validation live in ``rollflow.configuration.loader``; this module only
declares fields and the checks that concern a single section (``__post_init__``).

What it is not: it does not read files, talk to storage or know about Prefect.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from rollflow.api.errors import ConfigError

# Where launched servers, the watcher and clients read the inference API key when the config has none.
INFERENCE_API_KEY_ENV = "ROLLFLOW_INFERENCE_API_KEY"
INFERENCE_WEIGHTS_ROOTS_ENV = "ROLLFLOW_WEIGHTS_ROOTS"  # directories a CPU server may load weights from


def is_loopback_host(host: str) -> bool:
    """True for a bind address only this machine can reach: ``localhost``, ``127.0.0.0/8``, ``::1``.

    ``0.0.0.0`` / ``::`` (every interface) and any other address or name are not loopback.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _help(text: str, **kw: Any) -> dict[str, Any]:
    return {"help": text, **kw}


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


@dataclass
class StorageConfig:
    root: str = field(
        default="runs/storage",
        metadata=_help(
            "Where trajectories and checkpoints live: a local path, file://..., or s3://bucket/prefix. "
            "Everything goes under {root}/{experiment}/{trial}/."
        ),
    )
    options: dict[str, Any] = field(
        default_factory=dict,
        metadata=_help(
            "fsspec storage options, e.g. {endpoint_url: http://127.0.0.1:9000, key: ..., secret: ...}. "
            "Prefer the AWS_* environment variables or a Prefect Secret block for credentials; "
            "secret values are redacted from logs and MLflow params.",
            secret_keys=("key", "secret", "token", "password", "aws_secret_access_key", "session_token"),
        ),
    )
    keep_checkpoints: int = field(
        default=3,
        metadata=_help(
            "Checkpoint GC keeps this many newest versions, and never one a live server still serves."
        ),
    )
    ack_ttl_s: float | None = field(
        default=300.0,
        metadata=_help(
            "A server's checkpoint ack counts for checkpoint GC only this many seconds after it was "
            "written; watchers re-ack what their servers serve every ack_ttl_s / 4. So a dead server (or "
            "one from an earlier run of the trial, which had other ports) stops holding old checkpoints "
            "after ack_ttl_s. Keep it above the longest checkpoint download + load. null = acks never "
            "expire (GC then stops for good at the oldest version any server ever served last)."
        ),
    )
    local_cache: str = field(
        default="runs/cache",
        metadata=_help("Local directory where inference workers cache verified checkpoints."),
    )

    def __post_init__(self) -> None:
        _check(self.root != "", "storage.root", "must not be empty; use a path or s3://bucket/prefix")
        _check(self.keep_checkpoints >= 1, "storage.keep_checkpoints", "must be >= 1")
        if self.ack_ttl_s is not None:
            _check(
                self.ack_ttl_s > 0,
                "storage.ack_ttl_s",
                "must be > 0 seconds, or null for acks that never expire",
            )


@dataclass
class TinyModelConfig:
    hidden_size: int = field(default=128, metadata=_help("Hidden width of the tiny Llama model."))
    num_layers: int = field(default=4, metadata=_help("Transformer layers of the tiny model."))
    num_heads: int = field(default=4, metadata=_help("Attention heads of the tiny model."))
    num_kv_heads: int = field(default=2, metadata=_help("Key/value heads (GQA) of the tiny model."))
    warm_start_steps: int = field(
        default=500,
        metadata=_help("Supervised warm-start steps on the synthetic task before RL (0 = random init)."),
    )
    warm_start_lr: float = field(default=3e-3, metadata=_help("Learning rate of the warm start."))
    intermediate_size: int | None = field(
        default=None, metadata=_help("MLP width of the tiny model (None = 2 * hidden_size).")
    )
    max_position_embeddings: int = field(
        default=512, metadata=_help("Longest sequence (prompt + completion, all turns) the tiny model takes.")
    )
    warm_start_batch_size: int = field(
        default=64, metadata=_help("Sequences per warm-start step (each is 17-18 tokens).")
    )
    warm_start_p_correct: float = field(
        default=0.2,
        metadata=_help(
            "Tasks add_habit and tool_lookup (the other tasks' labels are always right); tool_lookup: "
            "the share of conversations that call the tool, the rest answer 'unknown'. "
            "After the clean phase, warm-start labels are the right sum with this probability, else the "
            "sum + 1 (except for problems with a multiple of ten as operand). Greedy decoding then says "
            "sum + 1 and RL has to unlearn it; a group of 8 samples holds a right answer with prob "
            "about 1 - (1 - p)^8."
        ),
    )
    warm_start_clean_fraction: float = field(
        default=0.4,
        metadata=_help(
            "Tasks add_habit and tool_lookup. Fraction of warm-start steps trained on right answers only (the sum, "
            "or the tool call and the copies, are learnt faster without the habit); the rest add the habit."
        ),
    )

    def __post_init__(self) -> None:
        _check(
            self.intermediate_size is None or self.intermediate_size > 0,
            "model.tiny.intermediate_size",
            "must be > 0 or null",
        )
        _check(self.max_position_embeddings >= 32, "model.tiny.max_position_embeddings", "must be >= 32")
        _check(self.warm_start_batch_size >= 1, "model.tiny.warm_start_batch_size", "must be >= 1")
        _check(
            0.0 <= self.warm_start_p_correct <= 1.0, "model.tiny.warm_start_p_correct", "must be in [0, 1]"
        )
        _check(
            0.0 <= self.warm_start_clean_fraction < 1.0,
            "model.tiny.warm_start_clean_fraction",
            "must be in [0, 1) so the habit is trained at all",
        )
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            _check(getattr(self, key) > 0, f"model.tiny.{key}", "must be > 0")
        _check(
            self.hidden_size % self.num_heads == 0,
            "model.tiny.hidden_size",
            "must be divisible by model.tiny.num_heads",
        )
        _check(
            self.num_heads % self.num_kv_heads == 0,
            "model.tiny.num_kv_heads",
            "must divide model.tiny.num_heads",
        )
        _check(self.warm_start_steps >= 0, "model.tiny.warm_start_steps", "must be >= 0")


@dataclass
class ModelConfig:
    path: str = field(
        default="runs/models/tiny",
        metadata=_help(
            "Hugging Face model directory or hub name of the initial policy. With bootstrap_tiny the "
            "tiny model is built here first."
        ),
    )
    bootstrap_tiny: bool = field(
        default=False,
        metadata=_help("Build the local tiny Llama model + tokenizer at `path` (no hub needed)."),
    )
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig, metadata=_help("The tiny model."))
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32", metadata=_help("Parameter dtype for training and CPU inference.")
    )
    trust_remote_code: bool = field(
        default=False,
        metadata=_help("Allow model code from the hub. Off by default: it executes downloaded code."),
    )
    gradient_checkpointing: bool = field(
        default=False, metadata=_help("Trade compute for memory in the trainer.")
    )


SyntheticTaskName = Literal["add_habit", "add_gap", "shift_gap", "tool_lookup"]


@dataclass
class SyntheticTaskConfig:
    n_train: int = field(default=2000, metadata=_help("Training prompts of the synthetic task."))
    n_eval: int = field(default=200, metadata=_help("Held-out prompts, disjoint from training."))
    seed: int = field(default=1234, metadata=_help("Seed of the synthetic prompt sets."))
    task: SyntheticTaskName = field(
        default="add_habit",
        metadata=_help(
            "Task family (rollflow/data/tasks/). add_habit: two-digit addition with a planted +1 habit "
            "that RL removes in ~30 steps (smoke test); add_gap: two-digit addition whose warm start "
            "never saw an operand in 40-59, held out = such problems; shift_gap: shift a word's letters "
            "by k ('abc+3=' -> 'def'), warm start never saw k = 4 or 5, held out = such problems; "
            "tool_lookup: an agent (AgentWorkflow) must call a lookup tool whose values it cannot know, "
            "2 model turns, warm start with a planted answer-without-the-tool habit. "
            "With model.bootstrap_tiny the tiny model is warm-started for this task."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.n_train > 0, "dataset.synthetic.n_train", "must be > 0")
        _check(self.n_eval > 0, "dataset.synthetic.n_eval", "must be > 0")
        tasks = get_args(SyntheticTaskName)
        _check(self.task in tasks, "dataset.synthetic.task", f"must be one of {', '.join(tasks)}")


@dataclass
class DatasetConfig:
    kind: Literal["synthetic", "files", "hub"] = field(
        default="synthetic",
        metadata=_help(
            "synthetic: the built-in verifiable task; files: local or s3:// parquet/jsonl/csv; "
            "hub: a Hugging Face dataset name (needs network)."
        ),
    )
    path: str = field(
        default="",
        metadata=_help(
            "files: a path/glob/URL, or a {split: path} mapping written as 'train=a.jsonl,test=b.jsonl'; "
            "hub: the dataset name."
        ),
    )
    format: Literal["auto", "parquet", "json", "csv"] = field(
        default="auto", metadata=_help("File format; auto infers it from the extension.")
    )
    hub_config: str | None = field(
        default=None,
        metadata=_help("hub: the dataset's config name, e.g. 'main' for openai/gsm8k (None = default)."),
    )
    train_split: str = field(default="train", metadata=_help("Split used for rollouts."))
    eval_split: str = field(default="test", metadata=_help("Split used for evaluation."))
    prompt_field: str = field(default="question", metadata=_help("Column holding the prompt text."))
    messages_field: str | None = field(
        default=None,
        metadata=_help("Column holding chat messages [{role, content}]; overrides prompt_field."),
    )
    answer_field: str = field(default="answer", metadata=_help("Column holding the reference answer."))
    id_field: str | None = field(
        default=None, metadata=_help("Column holding a stable prompt id (default: split + row index).")
    )
    answer_format: Literal["gsm8k", "plain"] = field(
        default="plain",
        metadata=_help("gsm8k: the reference is the text after '####'; plain: the whole field."),
    )
    system_prompt: str | None = field(
        default=None, metadata=_help("Optional system message prepended to every prompt.")
    )
    on_bad_row: Literal["error", "skip"] = field(
        default="error",
        metadata=_help("A malformed row raises an error naming it, or is skipped and counted."),
    )
    max_rows: int | None = field(
        default=None, metadata=_help("Use at most this many rows per split (None = all).")
    )
    reward_fn: str = field(
        default="rollflow.rewards.synthetic:synthetic_reward_fn",
        metadata=_help("Import string 'pkg.module:function' of the verifiable reward."),
    )
    synthetic: SyntheticTaskConfig = field(
        default_factory=SyntheticTaskConfig, metadata=_help("The built-in synthetic task.")
    )

    def __post_init__(self) -> None:
        if self.kind != "synthetic":
            _check(self.path != "", "dataset.path", f"is required when dataset.kind={self.kind!r}")
        _check(":" in self.reward_fn, "dataset.reward_fn", "must look like 'pkg.module:function'")
        if self.max_rows is not None:
            _check(self.max_rows > 0, "dataset.max_rows", "must be > 0 or null")


@dataclass
class GenerationConfig:
    max_new_tokens: int = field(default=16, metadata=_help("Completion length limit per turn."))
    temperature: float = field(
        default=1.0, metadata=_help("Sampling temperature for rollouts (1.0 keeps logprobs exact).")
    )
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling threshold (1.0 = off)."))
    top_k: int = field(default=-1, metadata=_help("Top-k sampling (-1 = off), SGLang semantics."))
    min_p: float = field(default=0.0, metadata=_help("Min-p sampling threshold (0 = off)."))
    stop_token_ids: list[int] = field(
        default_factory=list, metadata=_help("Extra token ids that end generation (EOS always does).")
    )

    def __post_init__(self) -> None:
        _check(self.max_new_tokens > 0, "rollout.generation.max_new_tokens", "must be > 0")
        _check(self.temperature >= 0, "rollout.generation.temperature", "must be >= 0 (0 = greedy)")
        _check(0 < self.top_p <= 1, "rollout.generation.top_p", "must be in (0, 1]")
        _check(self.top_k == -1 or self.top_k > 0, "rollout.generation.top_k", "must be -1 or > 0")
        _check(0 <= self.min_p < 1, "rollout.generation.min_p", "must be in [0, 1)")


@dataclass
class RolloutConfig:
    workflow: str = field(
        default="rollflow.workflows.rlvr:RLVRWorkflow",
        metadata=_help("Import string of the RolloutWorkflow class."),
    )
    workflow_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata=_help("Extra constructor kwargs of the workflow (e.g. max_turns, turn_discount)."),
    )
    group_size: int = field(
        default=8, metadata=_help("Samples per prompt; GRPO normalises rewards within a group.")
    )
    max_concurrent_rollouts: int = field(
        default=64, metadata=_help("Upper bound on episodes in flight (AReaL's concurrency limit).")
    )
    max_staleness: int = field(
        default=2,
        metadata=_help(
            "Max policy versions a trajectory may lag the trainer (AReaL's eta). 0 with "
            "pause_during_training is the synchronous baseline."
        ),
    )
    pause_during_training: bool = field(
        default=False,
        metadata=_help("Synchronous baseline: pause generation while the trainer runs a step."),
    )
    generation: GenerationConfig = field(
        default_factory=GenerationConfig, metadata=_help("Sampling parameters.")
    )
    shard_flush_rows: int = field(
        default=256, metadata=_help("Flush a trajectory shard once it holds this many rows.")
    )
    shard_flush_seconds: float = field(
        default=2.0, metadata=_help("Flush a non-empty shard after this many seconds.")
    )
    reward_workers: int = field(default=2, metadata=_help("Processes that run reward functions."))
    reward_timeout_s: float = field(
        default=10.0, metadata=_help("A reward slower than this scores 0 and is counted.")
    )
    max_failure_rate: float = field(
        default=0.2,
        metadata=_help("Stop the loop when more than this fraction of episodes raise (after 20)."),
    )
    max_epochs: int | None = field(
        default=None,
        metadata=_help("Stop after this many passes over the train split (None = until training ends)."),
    )
    max_groups: int | None = field(
        default=None,
        metadata=_help(
            "Stop once the trial's storage holds this many accepted groups, restored ones included "
            "(None = no limit)."
        ),
    )
    should_accept_fn: str | None = field(
        default=None,
        metadata=_help(
            "Import string of fn(group) -> bool run on every finished group; False rejects it (e.g. "
            "drop groups whose rewards are all equal, which carry no GRPO signal). None = keep all."
        ),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=_help(
            "DAPO dynamic sampling: drop groups whose rewards are all equal (zero GRPO advantage) and "
            "generate more until each batch is full of groups with signal. Costs extra generation, "
            "counted as rollout/rejected_filtered. Applied before should_accept_fn when both are set."
        ),
    )
    dynamic_sampling_max_extra: float | None = field(
        default=None,
        metadata=_help(
            "Cap on dynamic sampling's extra generation: at most this many groups without signal are "
            "dropped per group kept (1.0 = at most twice the generation of plain sampling); past the cap "
            "a group without signal is kept. None = no cap (generate until every group has signal)."
        ),
    )
    zero_variance_skip_prob: float = field(
        default=0.0,
        metadata=_help(
            "Before generating, skip a prompt whose last group had all-equal rewards (all right or all "
            "wrong: zero GRPO advantage) with this probability; it is released, never generated, counted "
            "as rollout/rejected_skipped, and revisited in a later epoch (rollflow/rollout/prompt_filter.py). "
            "0 = off; must be < 1."
        ),
    )
    claim_block_size: int = field(
        default=4,
        metadata=_help(
            "Prompts a rollout worker claims at once in storage (one exclusive put per block); capped "
            "at train.batch_size. Larger blocks mean fewer requests; a held block's unstarted prompts "
            "count against the staleness bound."
        ),
    )
    worker_lease_s: float = field(
        default=60.0,
        metadata=_help(
            "A rollout worker whose state file is older than this is dead: other workers adopt its "
            "unfinished prompts. Keep it well above shard_flush_seconds and clock skew between hosts."
        ),
    )
    keep_partials: bool = field(
        default=True,
        metadata=_help(
            "At a graceful stop (Prefect cancel, SIGTERM, Ctrl-C) commit the episodes in flight as partial "
            "records (prompt, tokens so far, logprobs, per-token versions), which a resume continues "
            "instead of regenerating (rollflow/rollout/partials.py). False: they are regenerated."
        ),
    )
    partial_drain_s: float = field(
        default=5.0,
        metadata=_help(
            "At a graceful stop, how long to wait for the requests in flight to hand back their partial "
            "output; what has not come back by then is regenerated on resume, as without keep_partials."
        ),
    )

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "rollout.group_size", "must be >= 1 (GRPO needs >= 2 to learn)")
        _check(self.max_concurrent_rollouts >= 1, "rollout.max_concurrent_rollouts", "must be >= 1")
        _check(
            self.max_staleness >= 0,
            "rollout.max_staleness",
            "must be >= 0 (0 = on-policy; 1-4 are typical for async runs)",
        )
        _check(self.shard_flush_rows >= 1, "rollout.shard_flush_rows", "must be >= 1")
        _check(self.shard_flush_seconds > 0, "rollout.shard_flush_seconds", "must be > 0")
        _check(self.reward_workers >= 1, "rollout.reward_workers", "must be >= 1")
        _check(
            0.0 <= self.zero_variance_skip_prob < 1.0,
            "rollout.zero_variance_skip_prob",
            "must be in [0, 1) (1 would never revisit a skipped prompt)",
        )
        if self.dynamic_sampling_max_extra is not None:
            _check(
                self.dynamic_sampling_max_extra >= 0,
                "rollout.dynamic_sampling_max_extra",
                "must be >= 0 or null (null = no cap; 0 = keep every group, as without dynamic sampling)",
            )
        _check(self.reward_timeout_s > 0, "rollout.reward_timeout_s", "must be > 0")
        _check(0 < self.max_failure_rate <= 1, "rollout.max_failure_rate", "must be in (0, 1]")
        if self.max_epochs is not None:
            _check(self.max_epochs >= 1, "rollout.max_epochs", "must be >= 1 or null")
        if self.max_groups is not None:
            _check(self.max_groups >= 1, "rollout.max_groups", "must be >= 1 or null")
        if self.should_accept_fn is not None:
            _check(
                ":" in self.should_accept_fn,
                "rollout.should_accept_fn",
                "must look like 'pkg.module:function' or be null",
            )
        _check(self.claim_block_size >= 1, "rollout.claim_block_size", "must be >= 1")
        _check(self.worker_lease_s > 0, "rollout.worker_lease_s", "must be > 0")
        _check(self.partial_drain_s >= 0, "rollout.partial_drain_s", "must be >= 0")


@dataclass
class SGLangConfig:
    python: str = field(default="python", metadata=_help("Python executable that has sglang installed."))
    tp_size: int = field(default=1, metadata=_help("Tensor parallel size per server (--tp-size)."))
    mem_fraction_static: float | None = field(
        default=None, metadata=_help("--mem-fraction-static; None keeps SGLang's default.")
    )
    extra_args: list[str] = field(
        default_factory=list, metadata=_help("Extra launch_server arguments, passed verbatim.")
    )
    startup_timeout_s: float = field(
        default=600.0, metadata=_help("How long to wait for /health after launch.")
    )
    base_gpu_id: int = field(
        default=0,
        metadata=_help("GPU of the first server; server i gets --base-gpu-id base_gpu_id + i * tp_size."),
    )


@dataclass
class VLLMConfig:
    python: str = field(
        default=".venv-vllm/bin/python",
        metadata=_help(
            "Python executable that has vLLM installed (a relative path is resolved against the repository "
            "root; `make vllm-venv` builds the default, vLLM's CPU build, in its own venv)."
        ),
    )
    dtype: str = field(default="auto", metadata=_help("--dtype (float32 for the tiny CPU models)."))
    max_model_len: int | None = field(
        default=None, metadata=_help("--max-model-len; None keeps the model's context length.")
    )
    max_num_seqs: int | None = field(
        default=None, metadata=_help("--max-num-seqs; None = inference.max_batch_size.")
    )
    enforce_eager: bool = field(
        default=False, metadata=_help("--enforce-eager (no CUDA graphs / compilation; on for tiny CPU runs).")
    )
    cpu_kvcache_space_gib: int = field(
        default=1, metadata=_help("CPU build: KV cache size in GiB ($VLLM_CPU_KVCACHE_SPACE).")
    )
    expose_control_endpoints: bool = field(
        default=False,
        metadata=_help(
            "Allow a non-loopback inference.host. vLLM's --api-key guards only /v1, /v2 and /inference; "
            "the dev-mode control routes rollflow needs (/pause, /resume, /collective_rpc, "
            "/update_weight_version) answer anyone who reaches the port, so put the server behind a "
            "network policy and set inference.api_key before turning this on."
        ),
    )
    extra_args: list[str] = field(
        default_factory=list, metadata=_help("Extra api_server arguments, passed verbatim (last).")
    )
    startup_timeout_s: float = field(
        default=300.0,
        metadata=_help("How long to wait for /health after launch (about 60 s on 2 CPU cores)."),
    )

    def __post_init__(self) -> None:
        _check(self.python.strip() != "", "inference.vllm.python", "must name a Python executable")
        _check(self.cpu_kvcache_space_gib >= 1, "inference.vllm.cpu_kvcache_space_gib", "must be >= 1")
        _check(self.startup_timeout_s > 0, "inference.vllm.startup_timeout_s", "must be > 0")


@dataclass
class InferenceConfig:
    backend: Literal["local", "vllm", "sglang", "external"] = field(
        default="local",
        metadata=_help(
            "local: rollflow's CPU server (SGLang protocol); vllm: launch vLLM servers (the CPU build here, "
            "the CUDA build on GPUs); sglang: launch SGLang servers; external: servers already running at "
            "`addresses` (they speak SGLang's protocol unless inference.engine says vllm)."
        ),
    )
    engine: Literal["auto", "local", "vllm", "sglang"] = field(
        default="auto",
        metadata=_help(
            "The protocol the client and watcher speak (docs/inference.md). auto: the backend's (external: "
            "sglang's)."
        ),
    )
    n_servers: int | Literal["auto"] = field(
        default=1,
        metadata=_help(
            "Servers to launch (local, sglang). auto (backend local): one server, sized by server_threads "
            "(rollflow.configuration.layout)."
        ),
    )
    addresses: list[str] = field(
        default_factory=list, metadata=_help("host:port of each server for backend=external.")
    )
    host: str = field(
        default="127.0.0.1",
        metadata=_help("Bind address of launched servers. Keep loopback unless you set api_key."),
    )
    base_port: int = field(default=0, metadata=_help("First port of launched servers (0 = pick free ports)."))
    api_key: str | None = field(
        default=None,
        metadata=_help(
            "Bearer key required by the servers (None = no auth). Prefer ROLLFLOW_INFERENCE_API_KEY.",
            secret=True,
        ),
    )
    max_batch_size: int = field(
        default=64, metadata=_help("CPU server: max sequences decoded together (continuous batching).")
    )
    server_threads: int | Literal["auto"] = field(
        default=1,
        metadata=_help(
            "CPU server: torch threads per server. auto: the cores the trainer (train.threads) leaves, split "
            "over the servers, resolved on the machine that loads the config."
        ),
    )
    request_timeout_s: float = field(default=120.0, metadata=_help("Timeout of one /generate call."))
    connect_timeout_s: float = field(default=5.0, metadata=_help("TCP connect timeout."))
    max_retries: int = field(default=3, metadata=_help("Retries per request before failing over."))
    retry_backoff_s: float = field(default=0.5, metadata=_help("Base of the exponential backoff."))
    affinity_lru_size: int = field(
        default=4096, metadata=_help("Remembered rid -> server assignments (multi-turn affinity).")
    )
    poll_interval_s: float = field(
        default=1.0,
        metadata=_help(
            "How often the checkpoint watcher reads LATEST in full (on S3: its request rate). An in-process"
            " publish (embedded mode) wakes it at once."
        ),
    )
    local_poll_interval_s: float = field(
        default=0.02,
        metadata=_help(
            "Local storage root: the watcher stats checkpoints/LATEST this often between full polls (one"
            " syscall), so a version published by another process is seen within it. 0 = off."
        ),
    )
    update_pause_mode: str = field(
        default="retract",
        metadata=_help(
            "How a weight update pauses a server (SGLang's /pause_generation mode; default retract, measured "
            "faster: docs/learning.md). abort: in-flight "
            "requests return their partial output and the client re-submits prompt + output so far (one "
            "HTTP round trip and one prefill per interrupted request); retract: the server keeps them, "
            "recomputes their KV cache under the new weights and continues (the same tokens and version "
            "spans as abort, without the round trips); in_place: the server keeps them and their KV cache "
            "from the old weights (cheapest; the tokens after the update attend to stale keys/values)."
        ),
    )
    initial_weight_version: str = field(
        default="0",
        metadata=_help(
            "weight_version that launched servers report for model.path (SGLang's --weight-version)."
        ),
    )
    startup_timeout_s: float = field(
        default=120.0, metadata=_help("CPU server: how long to wait for /health after launch.")
    )
    shutdown_timeout_s: float = field(
        default=15.0, metadata=_help("Launched servers get SIGTERM, then SIGKILL after this many seconds.")
    )
    weight_update_timeout_s: float = field(
        default=600.0,
        metadata=_help(
            "Watcher: timeout of one /update_weights_from_disk call (the server loads the weights)."
        ),
    )
    max_restarts: int = field(
        default=3,
        metadata=_help(
            "Launched servers (local, sglang) are supervised: one that dies is restarted on its address "
            "up to this many times, then dropped from routing with a ServerLostError in the log (the "
            "rollout fails once no server is left). 0 = drop at the first death."
        ),
    )
    supervise_interval_s: float = field(
        default=0.5, metadata=_help("How often the supervisor checks that launched servers are alive.")
    )
    dead_server_timeout_s: float = field(
        default=60.0,
        metadata=_help(
            "The rollout fails when no inference server has answered the watcher's checks for this long "
            "(servers nobody restarts, e.g. backend=external)."
        ),
    )
    sglang: SGLangConfig = field(default_factory=SGLangConfig, metadata=_help("SGLang launcher."))
    vllm: VLLMConfig = field(default_factory=VLLMConfig, metadata=_help("vLLM launcher."))

    def __post_init__(self) -> None:
        _check(self.n_servers == "auto" or self.n_servers >= 1, "inference.n_servers", "must be >= 1 or auto")
        _check(
            self.server_threads == "auto" or self.server_threads >= 1,
            "inference.server_threads",
            "must be >= 1 or auto",
        )
        if self.backend == "external":
            _check(
                len(self.addresses) > 0,
                "inference.addresses",
                "must list host:port of each server when inference.backend=external",
            )
        _check(self.request_timeout_s > 0, "inference.request_timeout_s", "must be > 0")
        _check(self.max_retries >= 0, "inference.max_retries", "must be >= 0")
        _check(self.poll_interval_s > 0, "inference.poll_interval_s", "must be > 0")
        _check(self.local_poll_interval_s >= 0, "inference.local_poll_interval_s", "must be >= 0 (0 = off)")
        _check(
            self.update_pause_mode in ("abort", "retract", "in_place"),
            "inference.update_pause_mode",
            f"must be abort, retract or in_place, got {self.update_pause_mode!r}",
        )
        _check(self.max_batch_size >= 1, "inference.max_batch_size", "must be >= 1")
        _check(0 <= self.base_port < 65536, "inference.base_port", "must be a port number or 0")
        _check(self.initial_weight_version != "", "inference.initial_weight_version", "must not be empty")
        _check(self.startup_timeout_s > 0, "inference.startup_timeout_s", "must be > 0")
        _check(self.shutdown_timeout_s > 0, "inference.shutdown_timeout_s", "must be > 0")
        _check(self.max_restarts >= 0, "inference.max_restarts", "must be >= 0 (0 = never restart)")
        _check(self.supervise_interval_s > 0, "inference.supervise_interval_s", "must be > 0")
        _check(self.dead_server_timeout_s > 0, "inference.dead_server_timeout_s", "must be > 0")


LLAMA_LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    rank: int = field(
        default=0,
        metadata=_help(
            "LoRA rank r. 0 = off: full fine-tuning (the default). > 0: the trainer trains only rank-r "
            "adapters (peft) on target_modules, publishes only the adapter (adapter_model.safetensors + "
            "adapter_config.json) and the servers merge it into their base weights (docs/lora.md). "
            "LoRA wants a larger train.lr than full fine-tuning (about 10x)."
        ),
    )
    alpha: float = field(
        default=32.0,
        metadata=_help(
            "LoRA alpha: the update is (alpha / rank) * B @ A. 32 keeps the best lr nearly independent of "
            "the rank (Schulman et al., 'LoRA Without Regret', 2025)."
        ),
    )
    dropout: float = field(
        default=0.0,
        metadata=_help(
            "Dropout on the adapter's input. 0 keeps the training forward equal to the proximal and "
            "behaviour policies' (dropout makes the PPO ratio noisy at step start)."
        ),
    )
    target_modules: list[str] = field(
        default_factory=lambda: list(LLAMA_LINEAR_MODULES),
        metadata=_help(
            "Names of the linear layers that get adapters (every module whose name ends with one). "
            "Default: every linear layer of a Llama block, attention and MLP (LoRA Without Regret: "
            "MLP layers matter most). A name no module has is an error."
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def __post_init__(self) -> None:
        _check(self.rank >= 0, "train.lora.rank", "must be >= 0 (0 = off: full fine-tuning)")
        _check(self.alpha > 0, "train.lora.alpha", "must be > 0 (32 is the default)")
        _check(0 <= self.dropout < 1, "train.lora.dropout", "must be in [0, 1)")
        if self.rank > 0:
            _check(
                bool(self.target_modules) and all(isinstance(m, str) and m for m in self.target_modules),
                "train.lora.target_modules",
                "must name at least one linear layer, e.g. [q_proj, v_proj]",
            )


@dataclass
class TrainConfig:
    steps: int = field(default=100, metadata=_help("Optimizer steps to run (= final policy version)."))
    batch_size: int = field(default=16, metadata=_help("Groups (prompts) per optimizer step."))
    max_tokens_per_mb: int = field(
        default=16384,
        metadata=_help("Token budget of a micro-batch (first-fit-decreasing, groups never split)."),
    )
    ppo_n_minibatches: int = field(
        default=1, metadata=_help("PPO updates per step; the batch is split into this many minibatches.")
    )
    ppo_epochs: int = field(
        default=2,
        metadata=_help(
            "Passes over each batch per step (off-policy reuse, GRPO's mu): every pass makes "
            "ppo_n_minibatches updates against the same proximal logprobs, the clip bounding the drift. "
            "2 (the default) halved the completions needed to reach 0.8 held-out on the outside-built task "
            "(docs/learning.md); it costs trainer compute only, which waits for data most of the time when "
            "generation bounds the run. Use 1 where the trainer is the bound (time/trainer/waiting_data_frac "
            "near 0)."
        ),
    )
    lr: float = field(default=1e-6, metadata=_help("AdamW learning rate."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=_help("AdamW betas."))
    warmup_steps: int = field(default=0, metadata=_help("Linear LR warmup steps."))
    lr_schedule: Literal["constant", "cosine"] = field(
        default="constant", metadata=_help("LR schedule after warmup.")
    )
    min_lr_ratio: float = field(
        default=0.0, metadata=_help("Cosine schedule: final lr as a fraction of train.lr (0 = decay to 0).")
    )
    grad_clip: float = field(default=1.0, metadata=_help("Max global gradient norm (0 = off)."))
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32", metadata=_help("Compute dtype of the trainer.")
    )
    eps_clip: float = field(default=0.2, metadata=_help("PPO clip range epsilon (lower bound 1 - eps)."))
    eps_clip_higher: float | None = field(
        default=None,
        metadata=_help("Asymmetric upper clip 1 + eps_high (DAPO's clip-higher); None = eps_clip."),
    )
    c_clip: float | None = field(
        default=None,
        metadata=_help("Dual-clip constant (> 1) bounding the loss for negative advantages; None = off."),
    )
    use_decoupled_loss: bool = field(
        default=True,
        metadata=_help(
            "Decoupled PPO (AReaL): ratio against the recomputed proximal policy, importance weight "
            "exp(prox - behav). Off: the behaviour logprobs are the proximal ones. Needs unfiltered "
            "sampling (top_p 1, top_k -1, min_p 0): the server reports logprobs of the unfiltered "
            "distribution, so with filtering exp(prox - behav) is not the importance weight."
        ),
    )
    behav_imp_weight_cap: float | None = field(
        default=5.0, metadata=_help("Cap of the behaviour importance weight; None = uncapped.")
    )
    behav_imp_weight_mode: Literal["mask", "truncate"] = field(
        default="mask", metadata=_help("mask: drop tokens above the cap; truncate: clamp to the cap.")
    )
    kl_ctl: float = field(
        default=0.0, metadata=_help("KL penalty coefficient to the frozen reference model (0 = off).")
    )
    kl_estimator: Literal["k1", "k2", "k3"] = field(
        default="k3", metadata=_help("KL estimator (Schulman's k1/k2/k3).")
    )
    adv_estimator: Literal["grpo", "rloo"] = field(
        default="grpo", metadata=_help("grpo: group-normalised rewards; rloo: leave-one-out baseline.")
    )
    adv_norm: Literal["mean_std", "mean"] = field(
        default="mean_std",
        metadata=_help(
            "GRPO normalisation: subtract the mean and divide by std, or mean only (Dr.GRPO's advantage; "
            "Dr.GRPO as published also sets loss_agg=seq-mean-token-sum-norm)."
        ),
    )
    reward_scale: float = field(default=1.0, metadata=_help("Multiply rewards before advantages."))
    reward_clip: float | None = field(
        default=None, metadata=_help("Clip scaled rewards to [-c, c]; None = off.")
    )
    loss_agg: Literal["token-mean", "seq-mean", "seq-mean-token-sum-norm"] = field(
        default="token-mean",
        metadata=_help(
            "token-mean: divide the summed token loss by the batch's loss tokens; seq-mean: average "
            "per sequence, then over sequences; seq-mean-token-sum-norm: divide by sequences x a "
            "constant L (loss_agg_max_tokens), Dr.GRPO's length-unbiased normaliser "
            "(derivation in rollflow/training/losses.py)."
        ),
    )
    loss_agg_max_tokens: int | None = field(
        default=None,
        metadata=_help(
            "The constant L of loss_agg=seq-mean-token-sum-norm; None = rollout.generation.max_new_tokens "
            "(multi-turn: set it to max_turns x max_new_tokens). It only scales the step, like lr."
        ),
    )
    checkpoint_every: int = field(
        default=1, metadata=_help("Publish a checkpoint every k versions (inference picks it up).")
    )
    resume_every: int = field(
        default=10, metadata=_help("Commit a resume point (model, optimizer, RNG, cursor) every n steps.")
    )
    data_wait_timeout_s: float = field(
        default=600.0, metadata=_help("Fail if no new trajectories arrive for this long.")
    )
    distributed: Literal["none", "ddp", "fsdp2"] = field(
        default="none",
        metadata=_help("Multi-process training under torchrun: FSDP2 fully_shard (GPU) or DDP (CPU/gloo)."),
    )
    nproc_per_node: int = field(default=1, metadata=_help("torchrun ranks when distributed != none."))
    threads: int = field(default=1, metadata=_help("torch threads of the trainer on CPU."))
    lora: LoraConfig = field(
        default_factory=LoraConfig, metadata=_help("LoRA adapters instead of full fine-tuning (off).")
    )

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "train.steps", "must be >= 1")
        _check(self.batch_size >= 1, "train.batch_size", "must be >= 1 group")
        _check(self.max_tokens_per_mb >= 1, "train.max_tokens_per_mb", "must be >= 1")
        if self.loss_agg_max_tokens is not None:
            _check(self.loss_agg_max_tokens >= 1, "train.loss_agg_max_tokens", "must be >= 1 or null")
        _check(self.ppo_n_minibatches >= 1, "train.ppo_n_minibatches", "must be >= 1")
        _check(self.ppo_epochs >= 1, "train.ppo_epochs", "must be >= 1 (1 = one pass, no reuse)")
        _check(
            self.batch_size >= self.ppo_n_minibatches,
            "train.ppo_n_minibatches",
            "must be <= train.batch_size",
        )
        _check(self.lr > 0, "train.lr", "must be > 0")
        _check(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]")
        _check(self.eps_clip > 0, "train.eps_clip", "must be > 0 (0.2 is the PPO default)")
        if self.eps_clip_higher is not None:
            _check(self.eps_clip_higher > 0, "train.eps_clip_higher", "must be > 0 or null")
        if self.c_clip is not None:
            _check(self.c_clip > 1, "train.c_clip", "must be > 1 (3.0 is the dual-clip default) or null")
        if self.behav_imp_weight_cap is not None:
            _check(self.behav_imp_weight_cap > 1, "train.behav_imp_weight_cap", "must be > 1 or null")
        _check(self.kl_ctl >= 0, "train.kl_ctl", "must be >= 0")
        _check(self.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1")
        _check(self.resume_every >= 1, "train.resume_every", "must be >= 1")
        _check(len(self.adam_betas) == 2, "train.adam_betas", "must be two numbers [beta1, beta2]")
        _check(self.nproc_per_node >= 1, "train.nproc_per_node", "must be >= 1")
        if self.reward_clip is not None:
            _check(self.reward_clip > 0, "train.reward_clip", "must be > 0 or null")


@dataclass
class EvalConfig:
    every_n_versions: int = field(
        default=10, metadata=_help("Evaluate every n published versions (0 = only before and after).")
    )
    n_prompts: int = field(default=200, metadata=_help("Held-out prompts per evaluation (0 = all)."))
    greedy: bool = field(default=True, metadata=_help("Greedy decoding (temperature 0) for evaluation."))
    max_new_tokens: int | None = field(
        default=None, metadata=_help("Completion limit; None = rollout.generation.max_new_tokens.")
    )
    split: str | None = field(default=None, metadata=_help("Split to score; None = dataset.eval_split."))

    def __post_init__(self) -> None:
        _check(self.every_n_versions >= 0, "eval.every_n_versions", "must be >= 0")
        _check(self.n_prompts >= 0, "eval.n_prompts", "must be >= 0")


@dataclass
class TrackingConfig:
    mlflow_tracking_uri: str | None = field(
        default=None,
        metadata=_help(
            "MLflow tracking URI (http://..., sqlite:///...). None: $MLFLOW_TRACKING_URI, else a SQLite "
            "file under runs/."
        ),
    )
    mlflow_experiment: str | None = field(
        default=None, metadata=_help("MLflow experiment name; None = the experiment name.")
    )
    register_model: bool = field(
        default=True, metadata=_help("Register the final checkpoint in the MLflow model registry.")
    )
    registered_model_name: str | None = field(
        default=None, metadata=_help("Registry name; None = '<experiment>-policy'.")
    )
    n_sample_trajectories: int = field(
        default=32, metadata=_help("Decoded trajectories logged as a table artifact.")
    )
    enabled: bool = field(default=True, metadata=_help("Log to MLflow at all."))


@dataclass
class OrchestrationConfig:
    mode: Literal["embedded", "distributed"] = field(
        default="embedded",
        metadata=_help(
            "embedded: async-rl runs servers, rollout and training in one flow run (one machine); "
            "distributed: async-rl triggers the rollout and train deployments on their work pools "
            "with run_deployment and waits for both."
        ),
    )
    rollout_deployment: str = field(
        default="rollout/gpu", metadata=_help("Deployment 'flow/name' of the rollout flow (distributed).")
    )
    train_deployment: str = field(
        default="train/gpu", metadata=_help("Deployment 'flow/name' of the train flow (distributed).")
    )
    n_rollout_workers: int = field(
        default=1,
        metadata=_help(
            "Distributed mode: rollout deployment runs to trigger; worker i gets worker_index=i (its "
            "writer id). Each runs its own inference servers and shares the trial's staleness bound."
        ),
    )
    deployment_timeout_s: float | None = field(
        default=None, metadata=_help("Give up waiting for the triggered runs after this long (None = never).")
    )
    stop_timeout_s: float = field(
        default=30.0, metadata=_help("Grace period for loops and servers to stop before they are killed.")
    )
    max_auto_resumes: int = field(
        default=3,
        metadata=_help(
            "Automatic resumes of one trial (the deployments' auto-resume trigger, prefect.yaml) allowed "
            "within auto_resume_window_s; past it the resumed run ends Failed (NotResumable) with the "
            "reason instead of training. 0 turns automatic resume off."
        ),
    )
    auto_resume_window_s: float = field(
        default=3600.0,
        metadata=_help("The window of max_auto_resumes, in seconds (counted in the trial's storage)."),
    )

    def __post_init__(self) -> None:
        _check(self.n_rollout_workers >= 1, "orchestration.n_rollout_workers", "must be >= 1")
        _check(self.max_auto_resumes >= 0, "orchestration.max_auto_resumes", "must be >= 0")
        _check(self.auto_resume_window_s > 0, "orchestration.auto_resume_window_s", "must be > 0")


@dataclass
class ExperimentConfig:
    experiment: str = field(default="tiny-arith", metadata=_help("Experiment name (MLflow experiment)."))
    trial: str = field(default="trial0", metadata=_help("Trial name; one MLflow run and storage prefix."))
    seed: int = field(default=1, metadata=_help("Global seed."))
    storage: StorageConfig = field(default_factory=StorageConfig, metadata=_help("Storage."))
    model: ModelConfig = field(default_factory=ModelConfig, metadata=_help("Policy model."))
    dataset: DatasetConfig = field(default_factory=DatasetConfig, metadata=_help("Prompts and reward."))
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=_help("Rollout loop."))
    inference: InferenceConfig = field(
        default_factory=InferenceConfig, metadata=_help("Inference servers and client.")
    )
    train: TrainConfig = field(default_factory=TrainConfig, metadata=_help("Trainer."))
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=_help("Evaluation."))
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata=_help("MLflow tracking."))
    orchestration: OrchestrationConfig = field(
        default_factory=OrchestrationConfig, metadata=_help("How Prefect runs the loops.")
    )

    def __post_init__(self) -> None:
        for key in ("experiment", "trial"):
            value = getattr(self, key)
            _check(
                value != "" and "/" not in value and value.strip() == value,
                key,
                "must be a non-empty name without '/' or surrounding spaces",
            )
        if self.rollout.pause_during_training:
            _check(
                self.rollout.max_staleness == 0,
                "rollout.max_staleness",
                "must be 0 when rollout.pause_during_training is on (the synchronous baseline)",
            )
        gen = self.rollout.generation
        filters = [
            f"{name}={value}"
            for name, value, off in (
                ("top_p", gen.top_p, 1.0),
                ("top_k", gen.top_k, -1),
                ("min_p", gen.min_p, 0.0),
            )
            if value != off
        ]
        if self.train.use_decoupled_loss and filters:
            # The server reports log p(token) of the temperature-scaled distribution BEFORE filtering
            # (SGLang's semantics), but samples from the filtered, renormalised one q. The true weight
            # is pi_prox / q = exp(prox - behav) * Z_kept, with Z_kept < 1 varying per token, so the
            # decoupled loss would train on silently wrong importance weights.
            _check(
                False,
                "train.use_decoupled_loss",
                f"cannot be on with filtered sampling ({', '.join(filters)} in rollout.generation): the "
                "behaviour logprobs come from the unfiltered distribution, so exp(prox - behav) is not the "
                "importance weight. Set train.use_decoupled_loss=false (PPO against the behaviour "
                "logprobs) or turn the filters off (top_p=1.0, top_k=-1, min_p=0.0)",
            )
        if self.dataset.kind == "synthetic":
            _check(
                self.train.batch_size <= self.dataset.synthetic.n_train,
                "train.batch_size",
                f"({self.train.batch_size} groups) exceeds the dataset "
                f"({self.dataset.synthetic.n_train} prompts); lower it or raise dataset.synthetic.n_train",
            )
            if self.rollout.max_epochs is not None:
                available = self.dataset.synthetic.n_train * self.rollout.max_epochs
                _check(
                    available >= self.train.batch_size * self.train.steps,
                    "train.steps",
                    f"needs {self.train.batch_size * self.train.steps} groups but the bounded run "
                    f"(rollout.max_epochs={self.rollout.max_epochs}) yields {available}; lower train.steps "
                    "or raise rollout.max_epochs",
                )
        if self.dataset.max_rows is not None:
            _check(
                self.train.batch_size <= self.dataset.max_rows,
                "train.batch_size",
                f"({self.train.batch_size}) exceeds dataset.max_rows ({self.dataset.max_rows})",
            )
