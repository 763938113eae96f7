"""The prompt rows a rollout worker runs, checked where they enter.

What it is: ``check_row`` (is one row usable: a ``prompt_id``, non-empty chat ``messages``, an
``answer``), ``checked_rows`` (the usable rows of a split; ``dataset.on_bad_row`` says whether a bad
row raises a ``DatasetRowError`` naming the row and field, or is skipped, logged and counted) and
``load_rows`` (the train split through ``rollflow.data``, checked, with a warning when a bounded dataset
cannot feed the trainer's steps).

What it is not: the data loader (``rollflow.data``) or the data order (``rollflow.rollout.prompt_source``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Literal

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import DatasetRowError
from rollflow.rollout.supply import bounded_supply_warning

logger = logging.getLogger(__name__)


def check_row(row: Any) -> str | None:
    """None if ``row`` is a usable prompt row, else ``"field 'x': why"``."""
    if not isinstance(row, dict):
        return f"row is a {type(row).__name__}, not a mapping"
    if not isinstance(row.get("prompt_id"), (str, int)) or isinstance(row.get("prompt_id"), bool):
        return "field 'prompt_id': missing or not a string/int"
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "field 'messages': missing or not a non-empty list"
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return f"field 'messages[{j}]': needs string 'role' and 'content'"
    if "answer" not in row or row["answer"] is None:
        return "field 'answer': missing"
    return None


def checked_rows(
    rows: Sequence[Any], *, split: str, on_bad_row: Literal["error", "skip"]
) -> tuple[list[dict], int]:
    """Rows that pass ``check_row``, and how many were skipped; raise on the first bad one in error mode."""
    good: list[dict] = []
    bad = 0
    for i, row in enumerate(rows):
        problem = check_row(row)
        if problem is None:
            good.append(row)
            continue
        if on_bad_row == "error":
            raise DatasetRowError(
                f"{split} row {i}: {problem} (fix the data, or set dataset.on_bad_row=skip to skip such rows)"
            )
        bad += 1
        logger.warning("skipping %s row %d: %s", split, i, problem)
    if not good:
        raise DatasetRowError(f"{split} split has no usable rows ({bad} malformed)")
    return good, bad


async def load_rows(cfg: ExperimentConfig, prompts: Sequence[Any] | None = None) -> tuple[list[dict], int]:
    """The usable rows of ``cfg.dataset.train_split`` (or of ``prompts``, when given) and the bad count."""
    split = cfg.dataset.train_split
    if prompts is None:
        from rollflow.data import load_prompts

        options = cfg.storage.options or None  # s3:// dataset files on the same store
        prompts = await asyncio.to_thread(lambda: load_prompts(cfg.dataset, split, storage_options=options))
    rows, bad = checked_rows(prompts, split=split, on_bad_row=cfg.dataset.on_bad_row)
    bounded_supply_warning(cfg, len(rows))  # a bounded dataset too small for the trainer: say so now
    return rows, bad
