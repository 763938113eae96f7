"""``model``: the initial policy, and ``model.tiny``, the locally built tiny Llama of the embedded default.

What it is not: the model code (``rollflow/models/``); only the fields and their single-section checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollflow.api.config.fields import check, help_


@dataclass
class TinyModelConfig:
    hidden_size: int = field(default=128, metadata=help_("Hidden width of the tiny Llama model."))
    num_layers: int = field(default=4, metadata=help_("Transformer layers of the tiny model."))
    num_heads: int = field(default=4, metadata=help_("Attention heads of the tiny model."))
    num_kv_heads: int = field(default=2, metadata=help_("Key/value heads (GQA) of the tiny model."))
    warm_start_steps: int = field(
        default=500,
        metadata=help_("Supervised warm-start steps on the synthetic task before RL (0 = random init)."),
    )
    warm_start_lr: float = field(default=3e-3, metadata=help_("Learning rate of the warm start."))
    intermediate_size: int | None = field(
        default=None, metadata=help_("MLP width of the tiny model (None = 2 * hidden_size).")
    )
    max_position_embeddings: int = field(
        default=512, metadata=help_("Longest sequence (prompt + completion, all turns) the tiny model takes.")
    )
    warm_start_batch_size: int = field(
        default=64, metadata=help_("Sequences per warm-start step (17-20 tokens each; tool_lookup's 50-75).")
    )
    warm_start_p_correct: float = field(
        default=0.2,
        metadata=help_(
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
        metadata=help_(
            "Tasks add_habit and tool_lookup. Fraction of warm-start steps trained on right answers only (the sum, "
            "or the tool call and the copies, are learnt faster without the habit); the rest add the habit."
        ),
    )
    warm_start_probe_extra_steps: int = field(
        default=0,
        metadata=help_(
            "Tasks that declare a warm-start probe (tool_lookup: the key and digit copies; "
            "rollflow/models/warm_start_probe.py). The probe runs at the end of the clean phase; while it "
            "fails, up to this many more clean steps (in chunks of 50, at the lr reached), then the "
            "habit. 0: probe and record only. Other tasks: unused."
        ),
    )

    def __post_init__(self) -> None:
        check(
            self.intermediate_size is None or self.intermediate_size > 0,
            "model.tiny.intermediate_size",
            "must be > 0 or null",
        )
        check(self.max_position_embeddings >= 32, "model.tiny.max_position_embeddings", "must be >= 32")
        check(self.warm_start_batch_size >= 1, "model.tiny.warm_start_batch_size", "must be >= 1")
        check(0.0 <= self.warm_start_p_correct <= 1.0, "model.tiny.warm_start_p_correct", "must be in [0, 1]")
        check(
            0.0 <= self.warm_start_clean_fraction < 1.0,
            "model.tiny.warm_start_clean_fraction",
            "must be in [0, 1) so the habit is trained at all",
        )
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads"):
            check(getattr(self, key) > 0, f"model.tiny.{key}", "must be > 0")
        check(
            self.hidden_size % self.num_heads == 0,
            "model.tiny.hidden_size",
            "must be divisible by model.tiny.num_heads",
        )
        check(
            self.num_heads % self.num_kv_heads == 0,
            "model.tiny.num_kv_heads",
            "must divide model.tiny.num_heads",
        )
        check(self.warm_start_steps >= 0, "model.tiny.warm_start_steps", "must be >= 0")
        check(
            self.warm_start_probe_extra_steps >= 0, "model.tiny.warm_start_probe_extra_steps", "must be >= 0"
        )


@dataclass
class ModelConfig:
    path: str = field(
        default="runs/models/tiny",
        metadata=help_(
            "Hugging Face model directory or hub name of the initial policy. With bootstrap_tiny the "
            "tiny model is built here first."
        ),
    )
    bootstrap_tiny: bool = field(
        default=False,
        metadata=help_("Build the local tiny Llama model + tokenizer at `path` (no hub needed)."),
    )
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig, metadata=help_("The tiny model."))
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32", metadata=help_("Parameter dtype for training and CPU inference.")
    )
    trust_remote_code: bool = field(
        default=False,
        metadata=help_("Allow model code from the hub. Off by default: it executes downloaded code."),
    )
    gradient_checkpointing: bool = field(
        default=False, metadata=help_("Trade compute for memory in the trainer.")
    )
