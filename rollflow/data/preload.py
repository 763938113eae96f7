"""Finish the heavy imports before the run's loops start in threads of one process.

What it is: ``preload_libraries()``, called by the flow before it submits the trainer, rollout and
evaluation loops. ``datasets``' fingerprint hasher checks ``"transformers" in sys.modules`` and then reads
``transformers.PreTrainedTokenizerBase``; ``transformers`` resolves its names lazily, on first access. When
one thread is still importing ``transformers`` (the trainer loading its model) while another hashes a
JSONL dataset (the rollout reading its rows), the hasher finds the half-imported module and fails with
``AttributeError: module 'transformers' has no attribute 'PreTrainedTokenizerBase'``. Resolving those names
once, in one thread, before any loop starts, removes the race.

What it is not: a general warm-up. It imports only what the loops touch from several threads.
"""

from __future__ import annotations

import importlib


def preload_libraries() -> None:
    """Import ``transformers`` (with the names other libraries read from it) and ``datasets`` completely."""
    transformers = importlib.import_module("transformers")
    for name in ("PreTrainedTokenizerBase", "PreTrainedModel", "AutoModelForCausalLM", "AutoTokenizer"):
        getattr(transformers, name)
    importlib.import_module("datasets")
