"""The embedded default's tiny model: a per-character tokenizer and a warm-started tiny Llama.

``build_tokenizer()`` and ``bootstrap_tiny_model(cfg, out_dir, seed=...)``; no model hub needed.
"""

from rollflow.models.bootstrap import bootstrap_tiny_model, read_marker, tiny_llama_config
from rollflow.models.tokenizer import build_tokenizer

__all__ = ["bootstrap_tiny_model", "build_tokenizer", "read_marker", "tiny_llama_config"]
