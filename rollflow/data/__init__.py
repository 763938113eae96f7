"""Prompt datasets: the loader (``load_prompts``), the GSM8K format and the synthetic task.

Rows are ``{"prompt_id", "messages", "answer", **passthrough}``; see ``rollflow.data.loader``.
"""

from rollflow.api.errors import DatasetRowError
from rollflow.data.gsm8k import gsm8k_dataset_config, load_gsm8k
from rollflow.data.loader import load_prompts, map_rows
from rollflow.data.synthetic import AdditionProblem, sample_problems, synthetic_rows

__all__ = [
    "AdditionProblem",
    "DatasetRowError",
    "gsm8k_dataset_config",
    "load_gsm8k",
    "load_prompts",
    "map_rows",
    "sample_problems",
    "synthetic_rows",
]
