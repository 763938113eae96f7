"""``eval``, ``tracking`` and ``orchestration``: held-out evaluation, MLflow, and how Prefect runs the loops.

What it is not: evaluation, tracking or the flows themselves; only the fields and their single-section
checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollflow.api.config.fields import check, help_


@dataclass
class EvalConfig:
    every_n_versions: int = field(
        default=10, metadata=help_("Evaluate every n published versions (0 = only before and after).")
    )
    n_prompts: int = field(default=200, metadata=help_("Held-out prompts per evaluation (0 = all)."))
    greedy: bool = field(default=True, metadata=help_("Greedy decoding (temperature 0) for evaluation."))
    max_new_tokens: int | None = field(
        default=None, metadata=help_("Completion limit; None = rollout.generation.max_new_tokens.")
    )
    split: str | None = field(default=None, metadata=help_("Split to score; None = dataset.eval_split."))
    correct_reward: float = field(
        default=1.0,
        metadata=help_(
            "A completion counts as correct (eval/accuracy) when its reward is >= this. When some held-out "
            "reward is neither 0 nor >= this (partial credit), the registry gate compares eval/mean_reward "
            "instead of accuracy."
        ),
    )

    def __post_init__(self) -> None:
        check(self.every_n_versions >= 0, "eval.every_n_versions", "must be >= 0")
        check(
            self.correct_reward == self.correct_reward and abs(self.correct_reward) != float("inf"),
            "eval.correct_reward",
            "must be a finite number",
        )
        check(self.n_prompts >= 0, "eval.n_prompts", "must be >= 0")


@dataclass
class TrackingConfig:
    mlflow_tracking_uri: str | None = field(
        default=None,
        metadata=help_(
            "MLflow tracking URI (http://..., sqlite:///...). None: $MLFLOW_TRACKING_URI, else a SQLite "
            "file under runs/."
        ),
    )
    mlflow_experiment: str | None = field(
        default=None, metadata=help_("MLflow experiment name; None = the experiment name.")
    )
    register_model: bool = field(
        default=True, metadata=help_("Register the final checkpoint in the MLflow model registry.")
    )
    registered_model_name: str | None = field(
        default=None, metadata=help_("Registry name; None = '<experiment>-policy'.")
    )
    register_merged: bool = field(
        default=True,
        metadata=help_(
            "LoRA runs (train.lora.rank > 0): the registry gets the adapter itself (peft files, with its base "
            "model's name, revision and weights digest) under the registry name; true also registers base + "
            "adapter merged, a plain transformers model, as '<registry name>-merged', which vLLM/SGLang serve "
            "as is (no --enable-lora, no rank limit, no LoRA kernels per token). It costs a full copy of the "
            "weights in the registry per registration. false: the adapter only. Full fine-tuning ignores it."
        ),
    )
    n_sample_trajectories: int = field(
        default=32, metadata=help_("Decoded trajectories logged as a table artifact.")
    )
    enabled: bool = field(default=True, metadata=help_("Log to MLflow at all."))


@dataclass
class OrchestrationConfig:
    mode: Literal["embedded", "distributed"] = field(
        default="embedded",
        metadata=help_(
            "embedded: async-rl runs servers, rollout and training in one flow run (one machine); "
            "distributed: async-rl triggers the rollout and train deployments on their work pools "
            "with run_deployment and waits for both."
        ),
    )
    rollout_deployment: str = field(
        default="rollout/gpu", metadata=help_("Deployment 'flow/name' of the rollout flow (distributed).")
    )
    train_deployment: str = field(
        default="train/gpu", metadata=help_("Deployment 'flow/name' of the train flow (distributed).")
    )
    n_rollout_workers: int = field(
        default=1,
        metadata=help_(
            "Distributed mode: rollout deployment runs to trigger; worker i gets worker_index=i (its "
            "writer id). Each runs its own inference servers and shares the trial's staleness bound."
        ),
    )
    deployment_timeout_s: float | None = field(
        default=None, metadata=help_("Give up waiting for the triggered runs after this long (None = never).")
    )
    stop_timeout_s: float = field(
        default=30.0, metadata=help_("Grace period for loops and servers to stop before they are killed.")
    )
    max_auto_resumes: int = field(
        default=3,
        metadata=help_(
            "Automatic resumes of one trial (the deployments' auto-resume trigger, prefect.yaml) allowed "
            "within auto_resume_window_s; past it the resumed run ends Failed (NotResumable) with the "
            "reason instead of training. 0 turns automatic resume off."
        ),
    )
    auto_resume_window_s: float = field(
        default=3600.0,
        metadata=help_("The window of max_auto_resumes, in seconds (counted in the trial's storage)."),
    )

    def __post_init__(self) -> None:
        check(self.n_rollout_workers >= 1, "orchestration.n_rollout_workers", "must be >= 1")
        check(self.max_auto_resumes >= 0, "orchestration.max_auto_resumes", "must be >= 0")
        check(self.auto_resume_window_s > 0, "orchestration.auto_resume_window_s", "must be > 0")
