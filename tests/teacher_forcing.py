"""Test helper: what the trainer computes for tokens a server generated (the ground truth of engine tests).

What it is: ``load_model`` (a tiny model directory in fp32), ``trainer_logprobs`` (the trainer's own
``forward_logprobs`` over prompt + output, the output positions) and ``kept_cache_logprobs`` (logprobs when
a prefix keeps the KV cache of one model and the rest runs under another: an ``in_place`` weight update).
What it is not: a server or a client; no I/O beyond loading the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def trainer_logprobs(model: Any, ids: list[int], n_prompt: int) -> list[float]:
    """The trainer's recomputation: ``forward_logprobs`` over prompt + output, the output positions."""
    from rollflow.training.logprobs import forward_logprobs

    logp, _ = forward_logprobs(model, torch.tensor([ids]))  # [1, T]
    return [float(x) for x in logp[0, n_prompt:]]


@torch.no_grad()
def kept_cache_logprobs(old: Any, new: Any, ids: list[int], n_cached: int) -> list[float]:
    """Logprobs of ``ids[n_cached + 1:]`` when positions ``[0, n_cached)`` keep the KV cache of ``old`` and the
    rest runs under ``new``."""
    cache = old(torch.tensor([ids[:n_cached]]), use_cache=True).past_key_values
    logits = new(torch.tensor([ids[n_cached:]]), past_key_values=cache, use_cache=True).logits[0]  # [T', V]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [float(logp[j, ids[n_cached + j + 1]]) for j in range(len(ids) - n_cached - 1)]
