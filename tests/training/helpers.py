"""Test helpers for the trainer: a tiny local Llama + tokenizer, and trajectory groups written as shards.

Not a fixture module: plain functions, so subprocess-driven tests and the conftest can share them.
No hub access: the tokenizer is a character-level WordLevel model built here, the model random.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any

VOCAB = ["<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>"] + list("0123456789+-*=?abcdefghijklmnopqrst ")


def make_tiny_model(path: str | Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """Save a random LlamaForCausalLM (vocab 40, 2 layers) and its tokenizer at ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rollflow.models.random_llama import save_random_llama

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>", unk_token="<|unk|>"
    )
    tokenizer.save_pretrained(path)
    return save_random_llama(
        path, seed=seed, vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, eos_token_id=3, bos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip


def make_group(
    group_id: str,
    *,
    n: int = 4,
    prompt_len: int = 5,
    completion_len: tuple[int, int] = (3, 8),
    version: int = 0,
    rng: random.Random | None = None,
    vocab: int = len(VOCAB),
) -> Any:
    """A TrajectoryGroup of ``n`` rows: random prompt + completion tokens, behaviour logprobs near log(1/V)."""
    from storage.schema import TrajectoryGroup, TrajectoryRow

    rng = rng or random.Random(zlib.crc32(group_id.encode()))  # stable across processes (no hash())
    prompt = [rng.randrange(4, vocab) for _ in range(prompt_len)]
    rows = []
    for i in range(n):
        c = rng.randint(*completion_len)
        ids = prompt + [rng.randrange(4, vocab) for _ in range(c)]
        mask = [0] * prompt_len + [1] * c
        # A random model predicts ~uniformly: log(1/40) ~ -3.7; jitter keeps behav != prox.
        logp = [0.0] * prompt_len + [-3.7 + rng.uniform(-0.3, 0.3) for _ in range(c)]
        versions = [-1] * prompt_len + [version] * c
        rows.append(
            TrajectoryRow.build(
                traj_id=f"{group_id}-{i}",
                group_id=group_id,
                prompt_id=f"p-{group_id}",
                input_ids=ids,
                loss_mask=mask,
                logprobs=logp,
                versions=versions,
                reward=float(rng.random() < 0.5),
                finish_reason="stop",
            )
        )
    return TrajectoryGroup(group_id=group_id, prompt_id=f"p-{group_id}", rows=rows)


def write_groups(
    storage: Any, group_ids: list[str], *, per_shard: int = 3, version: int = 0, **kw: Any
) -> None:
    """Write groups as committed shards, ``per_shard`` groups per shard, in order."""
    from storage.shard_writer import ShardWriter

    rng = random.Random(1234)
    w = ShardWriter(storage, "test", flush_rows=10**6, flush_seconds=3600.0)
    for i, gid in enumerate(group_ids):
        w.add(make_group(gid, version=version, rng=rng, **kw))
        if (i + 1) % per_shard == 0:
            w.flush()
    w.close()
