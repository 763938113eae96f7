"""GSM8K-format datasets: ``{"question": str, "answer": "...reasoning... #### 42"}`` rows.

What it is: the dataset config for GSM8K-format files (``question`` is the prompt, the reference is
what follows ``####`` in ``answer``, scored by ``rollflow.rewards.math:gsm8k_reward_fn``) and
``load_gsm8k``, a shortcut for ``load_prompts`` with that config. The same files as openai/gsm8k on
the hub; an original 21-row sample for tests is ``tests/data/fixtures/gsm8k_sample.jsonl``.

What it is not: a downloader. Point it at local or s3:// files, or use ``kind="hub"`` when online.

Usage::

    rows = load_gsm8k("data/gsm8k/{split}.jsonl", "train")
    rows[0]["answer"]   # "72"
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rollflow.api.config import DatasetConfig
from rollflow.data.loader import load_prompts

GSM8K_REWARD_FN = "rollflow.rewards.math:gsm8k_reward_fn"


def gsm8k_dataset_config(path: str, **overrides: Any) -> DatasetConfig:
    """A ``DatasetConfig`` for GSM8K-format files at ``path`` (any form ``load_prompts`` accepts)."""
    base = DatasetConfig(
        kind="files",
        path=path,
        prompt_field="question",
        answer_field="answer",
        answer_format="gsm8k",
        reward_fn=GSM8K_REWARD_FN,
    )
    return replace(base, **overrides)


def load_gsm8k(
    path: str, split: str = "train", *, storage_options: dict[str, Any] | None = None, **overrides: Any
) -> list[dict[str, Any]]:
    """Rows of a GSM8K-format split; ``overrides`` are ``DatasetConfig`` fields (``on_bad_row=...``)."""
    return load_prompts(gsm8k_dataset_config(path, **overrides), split, storage_options=storage_options)
