"""Prompt datasets: the loader (``load_prompts``), the GSM8K format and the synthetic tasks.

Rows are ``{"prompt_id", "messages", "answer", **passthrough}``; see ``rollflow.data.loader``.
The synthetic task families live in ``rollflow.data.tasks``; ``synthetic_rows`` picks one by config.
"""

from rollflow.api.errors import DatasetRowError
from rollflow.data.gsm8k import gsm8k_dataset_config, load_gsm8k
from rollflow.data.loader import load_prompts, map_rows
from rollflow.data.synthetic import synthetic_rows, task_module
from rollflow.data.tasks.add_habit import AdditionProblem, sample_problems

__all__ = [
    "AdditionProblem",
    "DatasetRowError",
    "gsm8k_dataset_config",
    "load_gsm8k",
    "load_prompts",
    "map_rows",
    "sample_problems",
    "synthetic_rows",
    "task_module",
]
