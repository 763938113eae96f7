"""The experiment configuration: one typed tree of dataclasses, one module per section.

What it is: every knob of a rollflow run, with help text and defaults taken from the papers
(GRPO, DAPO's asymmetric clip, dual-clip PPO, AReaL's decoupled loss and staleness bound).
The tree is plain dataclasses so Prefect renders it as a form and YAML maps onto it one to one.
Each section lives in its own module (``storage``, ``model``, ``dataset``, ``rollout``, ``inference``,
``train``, ``run``: eval, tracking and orchestration) with the checks that concern it alone
(``__post_init__``); ``experiment`` holds the root, ``ExperimentConfig``, and the checks that span
sections. Import every name from here: ``from rollflow.api.config import ExperimentConfig``.
Loading, overrides and validation against the environment live in ``rollflow.configuration.loader``.

What it is not: it does not read files, talk to storage or know about Prefect.
"""

from rollflow.api.config.dataset import (
    DatasetConfig,
    ReasoningGymConfig,
    SyntheticTaskConfig,
    SyntheticTaskName,
)
from rollflow.api.config.experiment import ExperimentConfig
from rollflow.api.config.inference import (
    INFERENCE_API_KEY_ENV,
    INFERENCE_WEIGHTS_ROOTS_ENV,
    InferenceConfig,
    SGLangConfig,
    VLLMConfig,
)
from rollflow.api.config.model import ModelConfig, TinyModelConfig
from rollflow.api.config.rollout import GenerationConfig, RolloutConfig
from rollflow.api.config.run import EvalConfig, OrchestrationConfig, TrackingConfig
from rollflow.api.config.storage import StorageConfig
from rollflow.api.config.train import LLAMA_LINEAR_MODULES, LoraConfig, TrainConfig

__all__ = [
    "INFERENCE_API_KEY_ENV",
    "INFERENCE_WEIGHTS_ROOTS_ENV",
    "LLAMA_LINEAR_MODULES",
    "DatasetConfig",
    "EvalConfig",
    "ExperimentConfig",
    "GenerationConfig",
    "InferenceConfig",
    "LoraConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "RolloutConfig",
    "SGLangConfig",
    "StorageConfig",
    "ReasoningGymConfig",
    "SyntheticTaskConfig",
    "SyntheticTaskName",
    "TinyModelConfig",
    "TrackingConfig",
    "TrainConfig",
    "VLLMConfig",
]
