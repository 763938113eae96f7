"""Inference fixtures: a tiny local model and a real CPU server on 127.0.0.1, shared by the whole session.

Self-contained on purpose: the model is a random ``LlamaForCausalLM`` and the tokenizer a per-character
``tokenizers`` WordLevel model (notes/stack.md section 6), both built here, no hub and no dependency on
``rollflow.models``. Reuse from any test under tests/rollout/ (tests/infra/conftest.py re-exports them)::

    def test_something(cpu_server):                  # a ServerGroup with one CPU server (session)
        addr = cpu_server.addresses[0]               # "127.0.0.1:PORT"

    def test_model(tiny_model_dir, tiny_model_dir_b):   # two checkpoints, same architecture, other weights
        ...

``cpu_server`` is shared: a test may generate, pause/continue or abort its own rids on it, but must leave
it unpaused and serving ``tiny_model_dir`` (weight_version "0"). Tests that swap weights or kill servers
start their own with ``launch_cpu_servers(model_dir, n)`` (a context manager).

Helpers (``write_tiny_model``, ``teacher_forced_logprobs``, ``launch_cpu_servers``, ...) come through the
``inference_lib`` fixture, because test modules cannot import a conftest reliably::

    def test_update(inference_lib, tmp_path):
        with inference_lib.launch_cpu_servers(inference_lib.write_tiny_model(tmp_path / "m"), 2) as group:
            ...
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

# Characters of the synthetic arithmetic task + a few letters; 4 specials first.
SPECIALS = ["<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>"]
CHARS = list("0123456789+-*=?: \nabcdefghijklmnopqrstuvwxyz")
TINY_ARCH: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def build_tiny_tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )


def write_tiny_model(path: Path, seed: int = 0, **arch: Any) -> Path:
    """Save a random tiny Llama (fp32 safetensors) + tokenizer + generation_config at ``path``."""
    import torch
    from transformers import GenerationConfig

    from rollflow.models.random_llama import random_llama

    tok = build_tiny_tokenizer()
    model = random_llama(
        seed=seed, vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False, **{**TINY_ARCH, **arch},
    )  # fmt: skip
    with torch.no_grad():  # larger logits than the default init so greedy choices are clear-cut
        model.lm_head.weight.mul_(8.0)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@functools.lru_cache(maxsize=8)
def _load_model(model_dir: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def teacher_forced_logits(model_dir: Path, ids: list[int]) -> Any:
    """``[T, V]`` fp32 logits of one full forward pass over ``ids`` (no cache); row t predicts ids[t+1]."""
    import torch

    with torch.no_grad():
        return _load_model(str(model_dir))(torch.tensor([ids])).logits[0].float()


def teacher_forced_logprobs(
    model_dir: Path, ids: list[int], n_prompt: int, temperature: float = 1.0
) -> list[float]:
    """log softmax(logits / T)[ids[t]] at every t >= n_prompt: what the server must report per token."""
    import torch

    logp = torch.log_softmax(teacher_forced_logits(model_dir, ids) / temperature, dim=-1)  # [T, V]
    return [float(logp[t - 1, ids[t]]) for t in range(n_prompt, len(ids))]


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


@contextlib.contextmanager
def launch_cpu_servers(model_dir: Path, n: int = 1, **overrides: Any) -> Iterator[Any]:
    """``n`` CPU servers (1 torch thread each) for the duration of the block."""
    from infra.servers import launch_local_servers
    from rollflow.api.config import InferenceConfig

    cfg = InferenceConfig(n_servers=n, server_threads=1, startup_timeout_s=90.0, **overrides)
    group = launch_local_servers(cfg, model_dir)
    try:
        yield group
    finally:
        group.stop(timeout_s=10)


# tests/infra/conftest.py loads this file a second time under another module name; session instances
# live in one process-wide holder so both directories share one model dir set and one server.
_STATE: dict[str, Any] = sys.modules.setdefault(
    "_rollflow_inference_fixture_state", ModuleType("_rollflow_inference_fixture_state")
).__dict__


def _shared_model_dir(tmp_path_factory: pytest.TempPathFactory, name: str, seed: int) -> Path:
    key = f"model-{name}"
    if key not in _STATE:
        _STATE[key] = write_tiny_model(tmp_path_factory.mktemp("tiny-model") / name, seed=seed)
    return _STATE[key]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + tokenizer on disk (vocab 48, hidden 64, 2 layers, context 1024)."""
    return _shared_model_dir(tmp_path_factory, "v0", seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture as ``tiny_model_dir``, different random weights (a "new version")."""
    return _shared_model_dir(tmp_path_factory, "v1", seed=1)


@pytest.fixture(scope="session")
def cpu_server(tiny_model_dir: Path) -> Iterator[Any]:
    """One CPU server serving ``tiny_model_dir`` as weight_version "0" for the whole session."""
    users: list[int] = _STATE.setdefault("cpu_server_users", [])
    if not users:  # first user starts it; the last one to finish stops it
        _STATE["cpu_server_cm"] = launch_cpu_servers(tiny_model_dir, 1)
        _STATE["cpu_server_group"] = _STATE["cpu_server_cm"].__enter__()
    users.append(1)
    try:
        yield _STATE["cpu_server_group"]
    finally:
        users.pop()
        if not users:
            _STATE.pop("cpu_server_cm").__exit__(None, None, None)


@pytest.fixture(scope="session")
def inference_lib() -> SimpleNamespace:
    """This file's helpers, for test modules (see the module docstring)."""
    return SimpleNamespace(
        write_tiny_model=write_tiny_model,
        build_tiny_tokenizer=build_tiny_tokenizer,
        teacher_forced_logprobs=teacher_forced_logprobs,
        teacher_forced_logits=teacher_forced_logits,
        launch_cpu_servers=launch_cpu_servers,
        vocab_size=vocab_size,
        TINY_ARCH=TINY_ARCH,
    )
