"""Qwen2-shaped models built from a config with random weights: real sizes without the hub.

What it is: ``SHAPES`` (the published Qwen2.5-0.5B and -1.5B shapes, and a tiny one for CI), ``build``
(a ``Qwen2ForCausalLM`` of one of them, random-initialised straight on the target device and dtype),
``lora_tensors`` (a random rank-r adapter for every linear layer of a block, named as peft names them)
and ``param_count`` / ``train_flops_per_token`` (the MFU arithmetic).

What it is not: a model zoo or a loader. The weights are random: these models measure bytes and FLOPs,
never accuracy. Imports only torch and transformers (bench/gpu_check.py runs on a bare CUDA machine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# Qwen2.5-{0.5B,1.5B}'s config.json shapes (vocabulary 151,936, tied embeddings, 2 KV heads).
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    # tiny: larger init, so its distributions are peaked (a misaligned logprob then differs by nats)
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        initializer_range=0.5,
    ),
}
COMMON: dict[str, Any] = dict(
    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=32768,
)  # fmt: skip
TINY_VOCAB = 512
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def config(size: str) -> Any:
    from transformers import Qwen2Config

    if size not in SHAPES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SHAPES)}")
    kw = {**COMMON, **SHAPES[size]}
    if size == "tiny":
        kw["vocab_size"] = TINY_VOCAB
    return Qwen2Config(**kw)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build(
    size: str, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu", seed: int = 0
) -> Any:
    """A ``Qwen2ForCausalLM`` of shape ``size`` with transformers' own random init, made on ``device``
    in ``dtype`` (no float32 copy of a bf16 model is ever held)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with _default_dtype(dtype), torch.device(device):
        model = Qwen2ForCausalLM(config(size))
    return model.to(device=device, dtype=dtype)


def param_count(model: torch.nn.Module) -> int:
    """Unique parameters (a tied lm_head counted once)."""
    return sum(p.numel() for p in model.parameters())


def train_flops_per_token(cfg: Any, n_params: int, seq_len: int) -> float:
    """FLOPs of one trained token: forward + backward = 6N, plus attention's 12 L d T (PaLM's appendix B:
    6N + 12 L H Q T for a sequence of T tokens; H Q = d). The embedding's lookup does no FLOPs, but a
    tied lm_head does, so N counts the embedding matrix once, as the logits' matmul."""
    return 6.0 * n_params + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def lora_tensors(
    size: str, rank: int, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A random rank-``rank`` adapter on every linear layer of every block, with peft's tensor names
    (``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` [r, in], ``lora_B`` [out, r])."""
    cfg = config(size)
    d, f = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    shapes = {  # (in, out)
        "self_attn.q_proj": (d, d), "self_attn.k_proj": (d, kv), "self_attn.v_proj": (d, kv),
        "self_attn.o_proj": (d, d), "mlp.gate_proj": (d, f), "mlp.up_proj": (d, f), "mlp.down_proj": (f, d),
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.num_hidden_layers):
        for name, (n_in, n_out) in shapes.items():
            base = f"base_model.model.model.layers.{i}.{name}"
            out[f"{base}.lora_A.weight"] = (torch.randn(rank, n_in, generator=gen) * 0.01).to(dtype)
            out[f"{base}.lora_B.weight"] = (torch.randn(n_out, rank, generator=gen) * 0.01).to(dtype)
    return out


def adapter_config(rank: int, alpha: float = 32.0) -> dict[str, Any]:
    """The adapter_config.json peft writes for such an adapter."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
        "target_modules": list(LINEAR_MODULES), "bias": "none", "base_model_name_or_path": None,
    }  # fmt: skip
