"""``train``: the trainer's optimiser, PPO/GRPO loss and checkpointing; ``train.lora``.

What it is not: the trainer (``rollflow/training/``); only the fields and their single-section checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollflow.api.config.fields import check, help_

LLAMA_LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    rank: int = field(
        default=0,
        metadata=help_(
            "LoRA rank r. 0 = off: full fine-tuning (the default). > 0: the trainer trains only rank-r "
            "adapters (peft) on target_modules, publishes only the adapter (adapter_model.safetensors + "
            "adapter_config.json) and the servers merge it into their base weights (docs/lora.md). "
            "LoRA wants a larger train.lr than full fine-tuning (about 10x)."
        ),
    )
    alpha: float = field(
        default=32.0,
        metadata=help_(
            "LoRA alpha: the update is (alpha / rank) * B @ A. 32 keeps the best lr nearly independent of "
            "the rank (Schulman et al., 'LoRA Without Regret', 2025)."
        ),
    )
    dropout: float = field(
        default=0.0,
        metadata=help_(
            "Dropout on the adapter's input. 0 keeps the training forward equal to the proximal and "
            "behaviour policies' (dropout makes the PPO ratio noisy at step start)."
        ),
    )
    target_modules: list[str] = field(
        default_factory=lambda: list(LLAMA_LINEAR_MODULES),
        metadata=help_(
            "Names of the linear layers that get adapters (every module whose name ends with one). "
            "Default: every linear layer of a Llama block, attention and MLP (LoRA Without Regret: "
            "MLP layers matter most). A name no module has is an error."
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def __post_init__(self) -> None:
        check(self.rank >= 0, "train.lora.rank", "must be >= 0 (0 = off: full fine-tuning)")
        # a finite alpha the servers merge (their limit is 1e4): NaN fails both comparisons
        check(
            0 < self.alpha <= 1e4,
            "train.lora.alpha",
            "must be a finite number in (0, 1e4] (32 is the default)",
        )
        check(0 <= self.dropout < 1, "train.lora.dropout", "must be in [0, 1)")
        if self.rank > 0:
            check(
                bool(self.target_modules) and all(isinstance(m, str) and m for m in self.target_modules),
                "train.lora.target_modules",
                "must name at least one linear layer, e.g. [q_proj, v_proj]",
            )


@dataclass
class WarmStartConfig:
    trial: str | None = field(
        default=None,
        metadata=help_(
            "An earlier trial of the same storage root whose committed trajectory groups this trial trains "
            "on first, in their commit order, before its own rollouts (an off-policy warm start; null = "
            "off). Each token's stored behaviour logprob is the decoupled loss's behaviour policy, so "
            "train.behav_imp_weight_cap bounds how far off-policy a token may be. The source trial is "
            "read, never written; it must have the same model. Risk: groups sampled by a policy far from "
            "this one are mostly masked by the cap (or, uncapped, give high-variance updates)."
        ),
    )
    experiment: str | None = field(
        default=None, metadata=help_("Experiment of the source trial; null = this trial's experiment.")
    )
    max_groups: int | None = field(
        default=None, metadata=help_("Reuse at most this many groups (the oldest); null = all.")
    )
    max_version: int | None = field(
        default=None,
        metadata=help_(
            "Reuse only groups whose head version (policy that began them) is <= this; null = all."
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.trial is not None

    def __post_init__(self) -> None:
        if self.trial is not None:
            check(bool(self.trial.strip()), "train.warm_start_from.trial", "must be a trial name or null")
        if self.max_groups is not None:
            check(self.max_groups >= 1, "train.warm_start_from.max_groups", "must be >= 1 or null")
        if self.max_version is not None:
            check(self.max_version >= 0, "train.warm_start_from.max_version", "must be >= 0 or null")


@dataclass
class TrainConfig:
    steps: int = field(default=100, metadata=help_("Optimizer steps to run (= final policy version)."))
    batch_size: int = field(default=16, metadata=help_("Groups (prompts) per optimizer step."))
    max_tokens_per_mb: int = field(
        default=16384,
        metadata=help_("Token budget of a micro-batch (first-fit-decreasing, groups never split)."),
    )
    ppo_n_minibatches: int = field(
        default=1, metadata=help_("PPO updates per step; the batch is split into this many minibatches.")
    )
    ppo_epochs: int = field(
        default=1,
        metadata=help_(
            "Passes over each batch per step (off-policy reuse, GRPO's mu): every pass makes "
            "ppo_n_minibatches updates against the same proximal logprobs, the clip bounding the drift. "
            "Evidence for the default: 1 is the peer value (TRL's num_iterations, verl's ppo_epochs). 2 "
            "halved the completions to 0.8 held-out on sub_gap, a dev family (docs/benchmarks.md, 'Every "
            "technique on sub_gap'), but was never run on the suite's test families, where 1 was judged "
            "against TRL (docs/benchmarks.md, 'Task families nobody tuned on'), so configs/tiny_hard.yaml "
            "sets it. It costs "
            "trainer compute only, which waits for data most of the time when generation bounds the run."
        ),
    )
    lr: float = field(default=1e-6, metadata=help_("AdamW learning rate."))
    weight_decay: float = field(default=0.0, metadata=help_("AdamW weight decay."))
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=help_("AdamW betas."))
    warmup_steps: int = field(default=0, metadata=help_("Linear LR warmup steps."))
    lr_schedule: Literal["constant", "cosine"] = field(
        default="constant",
        metadata=help_(
            "LR schedule after warmup. Evidence for the default: constant is the peer value (TRL's and "
            "verl's GRPO examples) and is what ran against TRL on the suite's test families "
            "(docs/benchmarks.md, 'Task families nobody tuned on'); cosine was never run there, and did "
            "not help on sub_gap, a dev family (docs/benchmarks.md, 'Staleness 1 against 2')."
        ),
    )
    min_lr_ratio: float = field(
        default=0.0, metadata=help_("Cosine schedule: final lr as a fraction of train.lr (0 = decay to 0).")
    )
    grad_clip: float = field(default=1.0, metadata=help_("Max global gradient norm (0 = off)."))
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32", metadata=help_("Compute dtype of the trainer.")
    )
    eps_clip: float = field(default=0.2, metadata=help_("PPO clip range epsilon (lower bound 1 - eps)."))
    eps_clip_higher: float | None = field(
        default=None,
        metadata=help_(
            "Asymmetric upper clip 1 + eps_high (DAPO's clip-higher); None = eps_clip. Evidence for the "
            "default: None (a symmetric clip) is the peer value and is what ran against TRL on the suite's "
            "test families (docs/benchmarks.md, 'Task families nobody tuned on'); 0.28 did not help on "
            "sub_gap, a dev family (docs/benchmarks.md, 'Every technique on sub_gap')."
        ),
    )
    c_clip: float | None = field(
        default=None,
        metadata=help_("Dual-clip constant (> 1) bounding the loss for negative advantages; None = off."),
    )
    use_decoupled_loss: bool = field(
        default=True,
        metadata=help_(
            "Decoupled PPO (AReaL): ratio against the recomputed proximal policy, importance weight "
            "exp(prox - behav). Off: the behaviour logprobs are the proximal ones. Needs unfiltered "
            "sampling (top_p 1, top_k -1, min_p 0): the server reports logprobs of the unfiltered "
            "distribution, so with filtering exp(prox - behav) is not the importance weight. Evidence for "
            "the default: it is the peers' (AReaL's). With one pass and one minibatch per step its clip "
            "never binds; false (PPO against the sampling policy) kept and learnt more on sub_gap, a dev "
            "family, but judged on the test families against TRL it was ahead on gcd and behind on "
            "products (docs/benchmarks.md, 'What makes rollflow forget' and 'The recalibrated suite')."
        ),
    )
    proximal: Literal["forward", "approx"] = field(
        default="forward",
        metadata=help_(
            "Where the decoupled loss's proximal logprobs come from. forward: a no-grad forward pass of the "
            "step's starting weights over the batch, one per micro-batch (exact). approx: no pass; each "
            "token's proximal logprob is interpolated in log space between its behaviour logprob and the "
            "current policy's, by how many versions the token is behind (A-3PO, arXiv 2512.06547; formula "
            "and assumptions in rollflow/training/proximal.py). With one minibatch and one pass per step "
            "it equals forward on every off-policy token, and on-policy tokens take their behaviour "
            "logprob. Opt-in until it wins on the suite's test families (never run there). Needs "
            "use_decoupled_loss; not with warm_start_from."
        ),
    )
    behav_imp_weight_cap: float | None = field(
        default=5.0, metadata=help_("Cap of the behaviour importance weight; None = uncapped.")
    )
    behav_imp_weight_mode: Literal["mask", "truncate"] = field(
        default="mask", metadata=help_("mask: drop tokens above the cap; truncate: clamp to the cap.")
    )
    kl_ctl: float = field(
        default=0.0,
        metadata=help_(
            "KL penalty coefficient to the frozen reference model (0 = off, the peers' value). With it on, "
            "groups whose rewards are all equal stay in the passes (their KL gradient is not zero): at "
            "0.04 a dev family ran 0.38x the steps per second and kept no more per step "
            "(docs/benchmarks.md, 'Keeping what the start solved')."
        ),
    )
    kl_estimator: Literal["k1", "k2", "k3"] = field(
        default="k3", metadata=help_("KL estimator (Schulman's k1/k2/k3).")
    )
    adv_estimator: Literal["grpo", "rloo"] = field(
        default="grpo", metadata=help_("grpo: group-normalised rewards; rloo: leave-one-out baseline.")
    )
    adv_norm: Literal["mean_std", "mean"] = field(
        default="mean_std",
        metadata=help_(
            "GRPO normalisation: subtract the mean and divide by std, or mean only (Dr.GRPO's advantage; "
            "Dr.GRPO as published also sets loss_agg=seq-mean-token-sum-norm)."
        ),
    )
    reward_scale: float = field(default=1.0, metadata=help_("Multiply rewards before advantages."))
    reward_clip: float | None = field(
        default=None, metadata=help_("Clip scaled rewards to [-c, c]; None = off.")
    )
    loss_agg: Literal["token-mean", "seq-mean", "seq-mean-token-sum-norm"] = field(
        default="token-mean",
        metadata=help_(
            "token-mean: divide the summed token loss by the batch's loss tokens; seq-mean: average "
            "per sequence, then over sequences; seq-mean-token-sum-norm: divide by sequences x a "
            "constant L (loss_agg_max_tokens), Dr.GRPO's length-unbiased normaliser "
            "(derivation in rollflow/training/losses.py)."
        ),
    )
    loss_agg_max_tokens: int | None = field(
        default=None,
        metadata=help_(
            "The constant L of loss_agg=seq-mean-token-sum-norm; None = rollout.generation.max_new_tokens "
            "(multi-turn: set it to max_turns x max_new_tokens). It only scales the step, like lr."
        ),
    )
    checkpoint_every: int = field(
        default=1, metadata=help_("Publish a checkpoint every k versions (inference picks it up).")
    )
    resume_every: int = field(
        default=10, metadata=help_("Commit a resume point (model, optimizer, RNG, cursor) every n steps.")
    )
    data_wait_timeout_s: float = field(
        default=600.0, metadata=help_("Fail if no new trajectories arrive for this long.")
    )
    distributed: Literal["none", "ddp", "fsdp2"] = field(
        default="none",
        metadata=help_("Multi-process training under torchrun: FSDP2 fully_shard (GPU) or DDP (CPU/gloo)."),
    )
    nproc_per_node: int = field(default=1, metadata=help_("torchrun ranks when distributed != none."))
    nnodes: int = field(
        default=1,
        metadata=help_(
            "Trainer nodes (torchrun --nnodes): nnodes x nproc_per_node ranks in all, one torchrun agent per "
            "node meeting at rdzv_endpoint (c10d rendezvous). > 1 needs distributed fsdp2 or ddp (docs/gpu.md)."
        ),
    )
    rdzv_endpoint: str = field(
        default="",
        metadata=help_(
            "host:port of the c10d rendezvous when nnodes > 1: an address every node reaches (node 0's, "
            "whose agent hosts the store). On Kubernetes the work pool sets it for each job "
            "($ROLLFLOW_RDZV_ENDPOINT, which takes precedence)."
        ),
    )
    threads: int = field(default=1, metadata=help_("torch threads of the trainer on CPU."))
    lora: LoraConfig = field(
        default_factory=LoraConfig, metadata=help_("LoRA adapters instead of full fine-tuning (off).")
    )
    warm_start_from: WarmStartConfig = field(
        default_factory=WarmStartConfig,
        metadata=help_("Train first on an earlier trial's committed groups, then online (off: trial null)."),
    )

    def __post_init__(self) -> None:
        check(self.steps >= 1, "train.steps", "must be >= 1")
        check(self.batch_size >= 1, "train.batch_size", "must be >= 1 group")
        check(self.max_tokens_per_mb >= 1, "train.max_tokens_per_mb", "must be >= 1")
        if self.loss_agg_max_tokens is not None:
            check(self.loss_agg_max_tokens >= 1, "train.loss_agg_max_tokens", "must be >= 1 or null")
        check(self.ppo_n_minibatches >= 1, "train.ppo_n_minibatches", "must be >= 1")
        check(self.ppo_epochs >= 1, "train.ppo_epochs", "must be >= 1 (1 = one pass, no reuse)")
        check(
            self.batch_size >= self.ppo_n_minibatches,
            "train.ppo_n_minibatches",
            "must be <= train.batch_size",
        )
        check(self.lr > 0, "train.lr", "must be > 0")
        check(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]")
        check(self.eps_clip > 0, "train.eps_clip", "must be > 0 (0.2 is the PPO default)")
        if self.eps_clip_higher is not None:
            check(self.eps_clip_higher > 0, "train.eps_clip_higher", "must be > 0 or null")
        if self.c_clip is not None:
            check(self.c_clip > 1, "train.c_clip", "must be > 1 (3.0 is the dual-clip default) or null")
        if self.behav_imp_weight_cap is not None:
            check(self.behav_imp_weight_cap > 1, "train.behav_imp_weight_cap", "must be > 1 or null")
        if self.proximal == "approx":
            check(
                self.use_decoupled_loss,
                "train.proximal",
                "'approx' needs train.use_decoupled_loss: true (without it the behaviour logprobs are the "
                "proximal ones and there is no pass to skip); set train.proximal: forward",
            )
            check(
                not self.warm_start_from.enabled,
                "train.proximal",
                "'approx' cannot place an earlier trial's groups (their versions count that trial's steps); "
                "with train.warm_start_from set train.proximal: forward",
            )
        check(self.kl_ctl >= 0, "train.kl_ctl", "must be >= 0")
        check(self.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1")
        check(self.resume_every >= 1, "train.resume_every", "must be >= 1")
        check(len(self.adam_betas) == 2, "train.adam_betas", "must be two numbers [beta1, beta2]")
        check(self.nproc_per_node >= 1, "train.nproc_per_node", "must be >= 1")
        check(self.nnodes >= 1, "train.nnodes", "must be >= 1")
        if self.nnodes > 1:
            check(
                self.distributed != "none", "train.nnodes", "> 1 needs train.distributed fsdp2 (GPU) or ddp"
            )
        if self.reward_clip is not None:
            check(self.reward_clip > 0, "train.reward_clip", "must be > 0 or null")
