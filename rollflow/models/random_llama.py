"""Random-weight Llama models: the one builder that tests, benches and smoke checks share.

What it is: ``random_llama(seed=..., **config)`` -> a ``LlamaForCausalLM`` with seeded random weights
(``torch.manual_seed(seed)`` right before construction, so a seed names the weights), its architecture
``SMALL_ARCH`` overridden by ``config`` (any ``LlamaConfig`` field); ``save_random_llama(path, ...)``
writes one as safetensors, with a tokenizer (its size is the vocabulary unless ``vocab_size`` is given)
and a generation config when given.

What it is not: the tiny model of the embedded task (``rollflow.models.bootstrap`` builds and warm-starts
that one), and nothing a training run loads implicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

SMALL_ARCH: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def random_llama(*, seed: int = 0, dtype: torch.dtype | None = None, **config: Any) -> LlamaForCausalLM:
    """A seeded random ``LlamaForCausalLM`` of ``SMALL_ARCH | config`` (``vocab_size`` is required)."""
    if "vocab_size" not in config:
        raise TypeError("random_llama needs vocab_size=... (or use save_random_llama with a tokenizer)")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**SMALL_ARCH, **config}))
    return model.to(dtype) if dtype is not None else model


def save_random_llama(
    path: Path,
    *,
    seed: int = 0,
    tokenizer: Any = None,
    generation_config: GenerationConfig | None = None,
    **config: Any,
) -> Path:
    """Write ``random_llama(seed, **config)`` to ``path`` (safetensors), plus ``tokenizer`` and
    ``generation_config`` when given; the vocabulary defaults to ``len(tokenizer)``."""
    if tokenizer is not None:
        config.setdefault("vocab_size", len(tokenizer))
    model = random_llama(seed=seed, **config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if generation_config is not None:
        generation_config.save_pretrained(path)
    return path
