"""Does the trainer fit beside SGLang on its GPU? An estimate from the model's shape and the config.

What it is: ``model_shape(path)`` (a local model directory's ``config.json``, or the published shapes of
the Qwen2.5 models the GPU configs name), ``trainer_peak_gb`` (the trainer's peak memory on one GPU) and
``memory_verdict`` (one line for ``rollflow plan``: what each GPU holds, and whether it fits).

The trainer's peak, in bytes, for N parameters, vocabulary V, L layers of width d and MLP width m, with
``T = train.max_tokens_per_mb`` tokens in a micro-batch (full fine-tuning, fp32 master weights, bf16
compute) on one of R ranks (FSDP2 shards the states and the bf16 copy over them):

    states       16 N / R                  fp32 weights 4 + fp32 gradients 4 + AdamW moments 8
    compute       2 N / R                  the bf16 copy of the weights the forward runs on
    logits       12 T V                    bf16 logits 2 + fp32 upcast 4 + fp32 gradient 4 + bf16 gradient 2
    activations   2 T (L d + 4 d + 3 m) x 4     gradient checkpointing: each layer's input kept (bf16),
                                                one layer's activations live at a time (x4: attention,
                                                MLP and their gradients)
                  2 T L (16 d + 3 m)        without it: every layer's activations kept

The token terms (logits and activations) are then multiplied by a factor measured on a card, ``1.35``
without gradient checkpointing and ``1.5`` with it (allocator blocks, the proximal forward's logits,
temporaries the sum leaves out): the GPU check's memory sweep on an NVIDIA H200 (Qwen2.5-0.5B and -1.5B
shapes, 4,096 to 16,384-token micro-batches, ``bench/results/gpu_check.json``) measured 0.94-1.32x the
plain sum; with the factors the estimate is at or above every measured peak, by at most 31 %.

SGLang holds ``inference.sglang.mem_fraction_static`` of its GPU (weights + KV cache; SGLang's own default
is about 0.8-0.9 on an 80 GB card). The logits term dominates at large vocabularies: Qwen2.5's 151,936
tokens x 16,384 tokens a micro-batch is 30 GB by itself.

What it is not: a measurement. It is arithmetic calibrated on one card and one torch version (2.11); the
GPU check's memory sweep (``python -m bench.gpu_check --memory``) measures a card (docs/gpu.md).
LoRA runs are not estimated (their states are the adapter's, far smaller).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rollflow.api.config import ExperimentConfig


@dataclass(frozen=True)
class ModelShape:
    params: int
    vocab: int
    hidden: int
    layers: int
    intermediate: int


# Published config.json shapes (huggingface.co/Qwen/<name>/config.json); parameters with tied embeddings.
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(494_032_768, 151_936, 896, 24, 4864),
    "Qwen/Qwen2.5-1.5B-Instruct": ModelShape(1_543_714_304, 151_936, 1536, 28, 8960),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape(7_615_616_512, 152_064, 3584, 28, 18944),
}
GB = 1e9
# The token terms' measured excess over the plain sum, by gradient checkpointing (module docstring).
MEASURED_TOKEN_FACTOR = {False: 1.35, True: 1.5}


def model_shape(path: str) -> ModelShape | None:
    """The shape of ``model.path``: a local directory's config.json (parameters from it), a known hub
    name, else None."""
    cfg_file = Path(path) / "config.json"
    if cfg_file.is_file():
        c = json.loads(cfg_file.read_text())
        d, layers, m, v = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
        heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        head = c.get("head_dim") or d // heads
        per_layer = d * heads * head * 2 + d * kv * head * 2 + 3 * d * m + 2 * d
        embed = v * d * (1 if c.get("tie_word_embeddings") else 2)
        return ModelShape(layers * per_layer + embed + d, v, d, layers, m)
    return KNOWN_SHAPES.get(path)


def trainer_peak_gb(
    shape: ModelShape, mb_tokens: int, *, gradient_checkpointing: bool, ranks: int = 1
) -> float:
    """The module docstring's sum, in GB (1e9 bytes)."""
    n, t = shape.params / max(1, ranks), mb_tokens
    d, m, layers = shape.hidden, shape.intermediate, shape.layers
    if gradient_checkpointing:
        act = 2 * t * (layers * d + 4 * d + 3 * m) * 4
    else:
        act = 2 * t * layers * (16 * d + 3 * m)
    factor = MEASURED_TOKEN_FACTOR[gradient_checkpointing]
    return (16 * n + 2 * n + factor * (12 * t * shape.vocab + act)) / GB


def max_fitting_tokens(
    shape: ModelShape, budget_gb: float, *, gradient_checkpointing: bool, ranks: int = 1
) -> int:
    """The largest micro-batch (a multiple of 1,024 tokens) whose estimate fits in ``budget_gb``; 0 if none."""
    fixed = trainer_peak_gb(shape, 0, gradient_checkpointing=gradient_checkpointing, ranks=ranks)
    per_token = trainer_peak_gb(shape, 1, gradient_checkpointing=gradient_checkpointing, ranks=ranks) - fixed
    if budget_gb <= fixed:
        return 0
    return int(math.floor((budget_gb - fixed) / per_token / 1024)) * 1024


def memory_verdict(cfg: ExperimentConfig, gpu_gb: float) -> str:
    """One line for the plan: the trainer's estimated peak, SGLang's share where they share a GPU, and
    whether it fits in ``gpu_gb``, with the largest ``train.max_tokens_per_mb`` that would."""
    shape = model_shape(cfg.model.path)
    if shape is None:
        return (
            f"not estimated: the shape of {cfg.model.path!r} is unknown here (give a local model directory)"
        )
    if cfg.train.lora.rank:
        return "not estimated for LoRA (the adapter's states are a small fraction of the full model's)"
    gc = cfg.model.gradient_checkpointing
    t = cfg.train.max_tokens_per_mb
    embedded = cfg.orchestration.mode == "embedded"
    ranks = 1 if embedded else cfg.train.nproc_per_node * cfg.train.nnodes
    peak = trainer_peak_gb(shape, t, gradient_checkpointing=gc, ranks=ranks)
    shared = embedded and cfg.inference.sglang.base_gpu_id == 0
    frac = cfg.inference.sglang.mem_fraction_static
    sglang_gb = (frac if frac is not None else 0.85) * gpu_gb if shared else 0.0
    budget = gpu_gb - sglang_gb
    where = (
        f"beside SGLang's {sglang_gb:.0f} GB (mem_fraction_static {frac if frac is not None else 'default ~0.85'})"
        if shared
        else ("alone on GPU 0" if embedded else f"per GPU, {ranks} FSDP2 ranks")
    )
    head = (
        f"trainer ~{peak:.0f} GB estimated ({shape.params / 1e9:.2f}B params, {t:,}-token micro-batches x "
        f"{shape.vocab:,} vocabulary, gradient checkpointing {'on' if gc else 'off'}) {where}, on a "
        f"{gpu_gb:.0f} GB GPU"
    )
    if peak <= budget * 0.9:
        return f"{head}: fits"
    fit = max_fitting_tokens(shape, budget * 0.9, gradient_checkpointing=gc, ranks=ranks)
    fix = f"train.max_tokens_per_mb={fit}" if fit else "a larger GPU or more trainer GPUs (FSDP2)"
    if shared:
        fix += " or inference.sglang.base_gpu_id: 1 (a GPU of its own)"
    return f"{head}: DOES NOT FIT (90% of {budget:.0f} GB); use {fix}"
