"""``rollout``: the workflow, group size, staleness bound, shards and worker leases; ``rollout.generation``.

What it is not: the rollout loop (``rollflow/rollout/``); only the fields and their single-section checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollflow.api.config.fields import check, help_

# The rule for learning defaults (docs/learning.md, "The rule for defaults"): a default differs from the
# peers' usual value (TRL / verl / AReaL: one pass per batch, no prompt skipping, AReaL's staleness 2)
# only where it won on the suite's test families (bench/suite/). None has been judged there yet, so every
# learning default is the peers'; the values tuned on add_gap stay in the configs tuned with them.
PEER_MAX_STALENESS = 2  # AReaL's GSM8K examples (max_head_offpolicyness 2)


@dataclass
class GenerationConfig:
    max_new_tokens: int = field(default=16, metadata=help_("Completion length limit per turn."))
    temperature: float = field(
        default=1.0, metadata=help_("Sampling temperature for rollouts (1.0 keeps logprobs exact).")
    )
    top_p: float = field(default=1.0, metadata=help_("Nucleus sampling threshold (1.0 = off)."))
    top_k: int = field(default=-1, metadata=help_("Top-k sampling (-1 = off), SGLang semantics."))
    min_p: float = field(default=0.0, metadata=help_("Min-p sampling threshold (0 = off)."))
    stop_token_ids: list[int] = field(
        default_factory=list, metadata=help_("Extra token ids that end generation (EOS always does).")
    )

    def __post_init__(self) -> None:
        check(self.max_new_tokens > 0, "rollout.generation.max_new_tokens", "must be > 0")
        check(  # float32 range: the sampler computes in float32 (1e39 is inf there); NaN fails too
            0 <= self.temperature <= 3.4e38,
            "rollout.generation.temperature",
            "must be a finite number >= 0 (0 = greedy)",
        )
        check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "rollout.generation.stop_token_ids",
            "must be token ids >= 0",
        )
        check(0 < self.top_p <= 1, "rollout.generation.top_p", "must be in (0, 1]")
        check(self.top_k == -1 or self.top_k > 0, "rollout.generation.top_k", "must be -1 or > 0")
        check(0 <= self.min_p < 1, "rollout.generation.min_p", "must be in [0, 1)")


@dataclass
class RolloutConfig:
    workflow: str = field(
        default="rollflow.workflows.rlvr:RLVRWorkflow",
        metadata=help_("Import string of the RolloutWorkflow class."),
    )
    workflow_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata=help_("Extra constructor kwargs of the workflow (e.g. max_turns, turn_discount)."),
    )
    group_size: int = field(
        default=8, metadata=help_("Samples per prompt; GRPO normalises rewards within a group.")
    )
    max_concurrent_rollouts: int = field(
        default=64, metadata=help_("Upper bound on episodes in flight (AReaL's concurrency limit).")
    )
    max_staleness: int = field(
        default=PEER_MAX_STALENESS,
        metadata=help_(
            "Max policy versions a trajectory may lag the trainer (AReaL's eta). 0 with "
            "pause_during_training is the synchronous baseline. Evidence for the default: 2 is the peer "
            "value (AReaL's examples), and the set of peer values is what ran against TRL on the suite's "
            "test families (docs/benchmarks.md, 'Task families nobody tuned on'); 1 learned more per "
            "generated token on sub_gap, a dev family (docs/benchmarks.md, 'Staleness 1 against 2'), but "
            "was never run on the test families, so configs/tiny_hard.yaml sets 1 and the default stays "
            "the peers'."
        ),
    )
    pause_during_training: bool = field(
        default=False,
        metadata=help_("Synchronous baseline: pause generation while the trainer runs a step."),
    )
    generation: GenerationConfig = field(
        default_factory=GenerationConfig, metadata=help_("Sampling parameters.")
    )
    shard_flush_rows: int | None = field(
        default=None,
        metadata=help_(
            "Flush a trajectory shard once it holds this many rows. None = one training batch's rows "
            "(train.batch_size x group_size), so a shard is never larger than what the trainer waits "
            "for. Whatever the size, the rollout commits its buffer at once when it can start no more "
            "episodes (the staleness bound is reached), so no step waits for shard_flush_seconds."
        ),
    )
    shard_flush_seconds: float = field(
        default=2.0, metadata=help_("Flush a non-empty shard after this many seconds.")
    )
    reward_workers: int = field(default=2, metadata=help_("Processes that run reward functions."))
    reward_timeout_s: float = field(
        default=10.0, metadata=help_("A reward slower than this scores 0 and is counted.")
    )
    max_failure_rate: float = field(
        default=0.2,
        metadata=help_("Stop the loop when more than this fraction of episodes raise (after 20)."),
    )
    max_epochs: int | None = field(
        default=None,
        metadata=help_("Stop after this many passes over the train split (None = until training ends)."),
    )
    max_groups: int | None = field(
        default=None,
        metadata=help_(
            "Stop once the trial's storage holds this many accepted groups, restored ones included "
            "(None = no limit)."
        ),
    )
    should_accept_fn: str | None = field(
        default=None,
        metadata=help_(
            "Import string of fn(group) -> bool run on every finished group; False rejects it (e.g. "
            "drop groups whose rewards are all equal, which carry no GRPO signal). None = keep all."
        ),
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata=help_(
            "DAPO dynamic sampling: drop groups whose rewards are all equal (zero GRPO advantage) and "
            "generate more until each batch is full of groups with signal. Costs extra generation, "
            "counted as rollout/rejected_filtered. Applied before should_accept_fn when both are set. "
            "Evidence for the default: off is the peer value (TRL; verl has it off unless asked) and is "
            "what ran against TRL on the suite's test families (docs/benchmarks.md, 'Task families nobody "
            "tuned on'); capped, it lost on sub_gap (docs/benchmarks.md, 'Every technique on sub_gap')."
        ),
    )
    dynamic_sampling_max_extra: float | None = field(
        default=None,
        metadata=help_(
            "Cap on dynamic sampling's extra generation: at most this many groups without signal are "
            "dropped per group kept (1.0 = at most twice the generation of plain sampling); past the cap "
            "a group without signal is kept. None = no cap (generate until every group has signal)."
        ),
    )
    skip_solved_prob: float | None = field(
        default=None,
        metadata=help_(
            "Prompt curriculum: before generating, skip a prompt whose last group was all solved (every "
            "reward equal and >= rollout.solved_reward: zero GRPO advantage) with this probability. It is "
            "released, never generated, counted as rollout/rejected_skipped, and revisited in a later "
            "epoch (rollflow/rollout/prompt_filter.py). None or 0 = off, the peer value (TRL and verl "
            "generate every prompt); must be < 1. Evidence for the default: 0.97 / 0.5 won a sweep on "
            "add_gap, a dev family (docs/benchmarks.md, 'The skip probabilities, swept'), and cost "
            "retention of solved problems on a task it was not tuned on; it was never run on the suite's "
            "test families, so it is off by default (the value judged there, docs/benchmarks.md 'Task "
            "families nobody tuned on') and set in configs/tiny_hard.yaml."
        ),
    )
    skip_unsolved_prob: float | None = field(
        default=None,
        metadata=help_(
            "Prompt curriculum: the same for a prompt whose last group was all unsolved (every reward "
            "equal and below rollout.solved_reward). None or 0 = off (the peer value); must be < 1."
        ),
    )
    curriculum_max_skips: int | None = field(
        default=3,
        metadata=help_(
            "Prompt curriculum: a prompt skipped this many times in a row runs the next time it comes "
            "up, whatever the draw, so every prompt is generated at least once in every "
            "curriculum_max_skips + 1 passes over the train split and a solved prompt that regressed "
            "gives a group with signal within (curriculum_max_skips + 1) x n_prompts / train.batch_size "
            "steps (rollflow/rollout/prompt_filter.py). None = no bound (a solved prompt at "
            "skip_solved_prob 0.97 is generated in about 3 % of passes). 3 is chosen by the bound it "
            "gives, not measured."
        ),
    )
    review_share: float = field(
        default=0.0,
        metadata=help_(
            "Prompt review: up to this share of the prompts started are solved prompts brought back "
            "before the policy forgets them, each in place of a fresh prompt (no extra generation; the "
            "displaced prompt comes back in its next epoch). A prompt joins the review set when its group "
            "was all solved and is due rollout.review_interval versions later; a review that still "
            "solves doubles its interval, a mixed one (a partial regression: that group repairs it) "
            "resets it, an all-wrong one drops it (rollflow/rollout/prompt_review.py). 0 = off, the peer "
            "value; at most 0.5. Evidence: at 0.25 it lost on sub_gap, a dev family (0.865 against 0.980 "
            "held out, 5 seeds; 81 % of reviews came back all solved, a group without gradient), and "
            "was level on count_bits (docs/benchmarks.md, 'Keeping what the start solved'), so it is off "
            "and was not run on the test families."
        ),
    )
    review_interval: int = field(
        default=4,
        metadata=help_(
            "Prompt review: policy versions between a solved prompt's group and its first review; "
            "doubles each time a review still solves (up to 64 x). Only with rollout.review_share > 0."
        ),
    )
    solved_reward: float = field(
        default=1.0,
        metadata=help_(
            "The reward at or above which a sample counts as solved, for the prompt curriculum "
            "(rollout.skip_solved_prob / skip_unsolved_prob) and the prompt review "
            "(rollout.review_share); the eval's 'correct' is the same 1.0."
        ),
    )
    claim_block_size: int = field(
        default=4,
        metadata=help_(
            "Prompts a rollout worker claims at once in storage (one exclusive put per block); capped "
            "at train.batch_size. Larger blocks mean fewer requests. Each prompt is checked against "
            "the staleness bound as it starts; a held block's unstarted prompts count against the "
            "prompts claimed after them (by any worker)."
        ),
    )
    worker_lease_s: float = field(
        default=60.0,
        metadata=help_(
            "A rollout worker whose state file is older than this is dead: other workers adopt its "
            "unfinished prompts. Keep it well above shard_flush_seconds and clock skew between hosts."
        ),
    )
    keep_partials: bool = field(
        default=True,
        metadata=help_(
            "At a graceful stop (Prefect cancel, SIGTERM, Ctrl-C) commit the episodes in flight as partial "
            "records (prompt, tokens so far, logprobs, per-token versions), which a resume continues "
            "instead of regenerating (rollflow/rollout/partials.py). False: they are regenerated."
        ),
    )
    partial_drain_s: float = field(
        default=5.0,
        metadata=help_(
            "At a graceful stop, how long to wait for the requests in flight to hand back their partial "
            "output; what has not come back by then is regenerated on resume, as without keep_partials."
        ),
    )

    def flush_rows(self, batch_size: int) -> int:
        """``shard_flush_rows``, or one training batch's rows ``batch_size * group_size`` when None."""
        return self.shard_flush_rows if self.shard_flush_rows is not None else batch_size * self.group_size

    def curriculum_probs(self) -> tuple[float, float]:
        """``(skip_solved_prob, skip_unsolved_prob)`` with None resolved to 0 (off, the peer value)."""
        return self.skip_solved_prob or 0.0, self.skip_unsolved_prob or 0.0

    def __post_init__(self) -> None:
        check(self.group_size >= 1, "rollout.group_size", "must be >= 1 (GRPO needs >= 2 to learn)")
        check(self.max_concurrent_rollouts >= 1, "rollout.max_concurrent_rollouts", "must be >= 1")
        check(
            self.max_staleness >= 0,
            "rollout.max_staleness",
            "must be >= 0 (0 = on-policy; 1-4 are typical for async runs)",
        )
        if self.shard_flush_rows is not None:
            check(self.shard_flush_rows >= 1, "rollout.shard_flush_rows", "must be >= 1 or null")
        check(self.shard_flush_seconds > 0, "rollout.shard_flush_seconds", "must be > 0")
        check(self.reward_workers >= 1, "rollout.reward_workers", "must be >= 1")
        for name in ("skip_solved_prob", "skip_unsolved_prob"):
            check(
                getattr(self, name) is None or 0.0 <= getattr(self, name) < 1.0,
                f"rollout.{name}",
                "must be in [0, 1) (1 would never revisit a skipped prompt)",
            )
        if self.dynamic_sampling_max_extra is not None:
            check(
                self.dynamic_sampling_max_extra >= 0,
                "rollout.dynamic_sampling_max_extra",
                "must be >= 0 or null (null = no cap; 0 = keep every group, as without dynamic sampling)",
            )
        check(self.reward_timeout_s > 0, "rollout.reward_timeout_s", "must be > 0")
        check(0 < self.max_failure_rate <= 1, "rollout.max_failure_rate", "must be in (0, 1]")
        if self.max_epochs is not None:
            check(self.max_epochs >= 1, "rollout.max_epochs", "must be >= 1 or null")
        if self.max_groups is not None:
            check(self.max_groups >= 1, "rollout.max_groups", "must be >= 1 or null")
        if self.should_accept_fn is not None:
            check(
                ":" in self.should_accept_fn,
                "rollout.should_accept_fn",
                "must look like 'pkg.module:function' or be null",
            )
        if self.curriculum_max_skips is not None:
            check(self.curriculum_max_skips >= 0, "rollout.curriculum_max_skips", "must be >= 0 or null")
        check(self.claim_block_size >= 1, "rollout.claim_block_size", "must be >= 1")
        check(
            0.0 <= self.review_share <= 0.5,
            "rollout.review_share",
            "must be in [0, 0.5] (0 = off; the rest of each batch is what learns)",
        )
        check(self.review_interval >= 1, "rollout.review_interval", "must be >= 1 policy version")
        check(self.worker_lease_s > 0, "rollout.worker_lease_s", "must be > 0")
        check(self.partial_drain_s >= 0, "rollout.partial_drain_s", "must be >= 0")
