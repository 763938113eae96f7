"""``ExperimentConfig``: the root of the tree, one field per section, and the checks that span sections.

What it is not: the loader (``rollflow.configuration.loader``: YAML, dotted overrides, the environment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollflow.api.config.dataset import DatasetConfig
from rollflow.api.config.fields import check, help_
from rollflow.api.config.inference import InferenceConfig
from rollflow.api.config.model import ModelConfig
from rollflow.api.config.rollout import RolloutConfig
from rollflow.api.config.run import EvalConfig, OrchestrationConfig, TrackingConfig
from rollflow.api.config.storage import StorageConfig
from rollflow.api.config.train import TrainConfig


@dataclass
class ExperimentConfig:
    experiment: str = field(default="tiny-arith", metadata=help_("Experiment name (MLflow experiment)."))
    trial: str = field(default="trial0", metadata=help_("Trial name; one MLflow run and storage prefix."))
    seed: int = field(default=1, metadata=help_("Global seed."))
    storage: StorageConfig = field(default_factory=StorageConfig, metadata=help_("Storage."))
    model: ModelConfig = field(default_factory=ModelConfig, metadata=help_("Policy model."))
    dataset: DatasetConfig = field(default_factory=DatasetConfig, metadata=help_("Prompts and reward."))
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata=help_("Rollout loop."))
    inference: InferenceConfig = field(
        default_factory=InferenceConfig, metadata=help_("Inference servers and client.")
    )
    train: TrainConfig = field(default_factory=TrainConfig, metadata=help_("Trainer."))
    eval: EvalConfig = field(default_factory=EvalConfig, metadata=help_("Evaluation."))
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata=help_("MLflow tracking."))
    orchestration: OrchestrationConfig = field(
        default_factory=OrchestrationConfig, metadata=help_("How Prefect runs the loops.")
    )

    def __post_init__(self) -> None:
        for key in ("experiment", "trial"):
            value = getattr(self, key)
            check(
                value != "" and "/" not in value and value.strip() == value,
                key,
                "must be a non-empty name without '/' or surrounding spaces",
            )
        if self.rollout.pause_during_training:
            check(
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
            check(
                False,
                "train.use_decoupled_loss",
                f"cannot be on with filtered sampling ({', '.join(filters)} in rollout.generation): the "
                "behaviour logprobs come from the unfiltered distribution, so exp(prox - behav) is not the "
                "importance weight. Set train.use_decoupled_loss=false (PPO against the behaviour "
                "logprobs) or turn the filters off (top_p=1.0, top_k=-1, min_p=0.0)",
            )
        if self.dataset.kind == "synthetic":
            check(
                self.train.batch_size <= self.dataset.synthetic.n_train,
                "train.batch_size",
                f"({self.train.batch_size} groups) exceeds the dataset "
                f"({self.dataset.synthetic.n_train} prompts); lower it or raise dataset.synthetic.n_train",
            )
            if self.rollout.max_epochs is not None:
                available = self.dataset.synthetic.n_train * self.rollout.max_epochs
                check(
                    available >= self.train.batch_size * self.train.steps,
                    "train.steps",
                    f"needs {self.train.batch_size * self.train.steps} groups but the bounded run "
                    f"(rollout.max_epochs={self.rollout.max_epochs}) yields {available}; lower train.steps "
                    "or raise rollout.max_epochs",
                )
        if self.dataset.max_rows is not None:
            check(
                self.train.batch_size <= self.dataset.max_rows,
                "train.batch_size",
                f"({self.train.batch_size}) exceeds dataset.max_rows ({self.dataset.max_rows})",
            )
