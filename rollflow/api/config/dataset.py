"""``dataset``: the prompts, their reference answers and the reward function, and ``dataset.synthetic``.

What it is not: the loader (``rollflow/data/``); only the fields and their single-section checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from rollflow.api.config.fields import check, help_

SYNTHETIC_REWARD = "rollflow.rewards.synthetic:synthetic_reward_fn"
REASONING_GYM_REWARD = "rollflow.rewards.reasoning_gym:reasoning_gym_reward"
SyntheticTaskName = Literal["add_habit", "add_gap", "shift_gap", "tool_lookup"]


@dataclass
class SyntheticTaskConfig:
    n_train: int = field(default=2000, metadata=help_("Training prompts of the synthetic task."))
    n_eval: int = field(default=200, metadata=help_("Held-out prompts, disjoint from training."))
    seed: int = field(default=1234, metadata=help_("Seed of the synthetic prompt sets."))
    task: SyntheticTaskName = field(
        default="add_habit",
        metadata=help_(
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
        check(self.n_train > 0, "dataset.synthetic.n_train", "must be > 0")
        check(self.n_eval > 0, "dataset.synthetic.n_eval", "must be > 0")
        tasks = get_args(SyntheticTaskName)
        check(self.task in tasks, "dataset.synthetic.task", f"must be one of {', '.join(tasks)}")


@dataclass
class ReasoningGymConfig:
    task: str = field(
        default="",
        metadata=help_(
            "A reasoning-gym generator name, e.g. 'basic_arithmetic', 'chain_sum', 'gcd' (the package's "
            "reasoning_gym.factory.DATASETS lists 100+). An unknown name is an error listing them."
        ),
    )
    params: dict[str, Any] = field(
        default_factory=dict,
        metadata=help_(
            "The generator's parameters for the RL prompts and the held-out set (the target setting), "
            "e.g. {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}. An unknown parameter is "
            "an error listing the generator's own."
        ),
    )
    warm_start_params: dict[str, Any] | None = field(
        default=None,
        metadata=help_(
            "An easier setting of the same generator for the tiny model's warm start "
            "(model.bootstrap_tiny); None = the target setting. The held-out set is always drawn from "
            "params."
        ),
    )
    size: int = field(default=2000, metadata=help_("Training prompts drawn from the generator."))
    eval_size: int = field(
        default=200,
        metadata=help_("Held-out prompts; a held-out question never appears among the training prompts."),
    )
    seed: int = field(default=1234, metadata=help_("Seed of the generator (the same seed, the same rows)."))

    def __post_init__(self) -> None:
        check(self.size > 0, "dataset.reasoning_gym.size", "must be > 0")
        check(self.eval_size > 0, "dataset.reasoning_gym.eval_size", "must be > 0")


@dataclass
class DatasetConfig:
    kind: Literal["synthetic", "files", "hub", "reasoning_gym"] = field(
        default="synthetic",
        metadata=help_(
            "synthetic: the built-in verifiable task; files: local or s3:// parquet/jsonl/csv; "
            "hub: a Hugging Face dataset name (needs network); reasoning_gym: a procedural task of the "
            "reasoning-gym package, scored by its own verifier (dataset.reasoning_gym)."
        ),
    )
    path: str = field(
        default="",
        metadata=help_(
            "files: a path/glob/URL, or a {split: path} mapping written as 'train=a.jsonl,test=b.jsonl'; "
            "hub: the dataset name."
        ),
    )
    format: Literal["auto", "parquet", "json", "csv"] = field(
        default="auto", metadata=help_("File format; auto infers it from the extension.")
    )
    hub_config: str | None = field(
        default=None,
        metadata=help_("hub: the dataset's config name, e.g. 'main' for openai/gsm8k (None = default)."),
    )
    train_split: str = field(default="train", metadata=help_("Split used for rollouts."))
    eval_split: str = field(default="test", metadata=help_("Split used for evaluation."))
    prompt_field: str = field(default="question", metadata=help_("Column holding the prompt text."))
    messages_field: str | None = field(
        default=None,
        metadata=help_("Column holding chat messages [{role, content}]; overrides prompt_field."),
    )
    answer_field: str = field(default="answer", metadata=help_("Column holding the reference answer."))
    id_field: str | None = field(
        default=None, metadata=help_("Column holding a stable prompt id (default: split + row index).")
    )
    answer_format: Literal["gsm8k", "plain"] = field(
        default="plain",
        metadata=help_("gsm8k: the reference is the text after '####'; plain: the whole field."),
    )
    system_prompt: str | None = field(
        default=None, metadata=help_("Optional system message prepended to every prompt.")
    )
    on_bad_row: Literal["error", "skip"] = field(
        default="error",
        metadata=help_("A malformed row raises an error naming it, or is skipped and counted."),
    )
    max_rows: int | None = field(
        default=None, metadata=help_("Use at most this many rows per split (None = all).")
    )
    reward_fn: str = field(
        default=SYNTHETIC_REWARD,
        metadata=help_(
            "Import string 'pkg.module:function' of the verifiable reward. With dataset.kind=reasoning_gym "
            f"the default becomes the generator's own verifier ({REASONING_GYM_REWARD})."
        ),
    )
    synthetic: SyntheticTaskConfig = field(
        default_factory=SyntheticTaskConfig, metadata=help_("The built-in synthetic task.")
    )
    reasoning_gym: ReasoningGymConfig = field(
        default_factory=ReasoningGymConfig,
        metadata=help_("dataset.kind=reasoning_gym: the generator, its settings, sizes and seed."),
    )

    def __post_init__(self) -> None:
        if self.kind == "reasoning_gym":
            check(
                self.reasoning_gym.task != "", "dataset.reasoning_gym.task", "is required (a generator name)"
            )
            if self.reward_fn == SYNTHETIC_REWARD:  # the verifier of the generator, unless one is named
                self.reward_fn = REASONING_GYM_REWARD
        elif self.kind != "synthetic":
            check(self.path != "", "dataset.path", f"is required when dataset.kind={self.kind!r}")
        check(":" in self.reward_fn, "dataset.reward_fn", "must look like 'pkg.module:function'")
        if self.max_rows is not None:
            check(self.max_rows > 0, "dataset.max_rows", "must be > 0 or null")
