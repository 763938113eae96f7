"""Reward functions and the process-pool runner that calls them.

``fn(prompt, completion, answer, **data) -> float`` (the contract: ``rollflow.api.rewards.RewardFn``),
importable as ``"pkg.module:name"``:
``rollflow.rewards.synthetic:synthetic_reward_fn`` (the embedded default's task),
``rollflow.rewards.math:gsm8k_reward_fn`` and ``...:math_reward_fn``.
``AsyncRewardRunner`` runs one in worker processes with a timeout (see ``runner``).
"""

from rollflow.rewards.math import (
    answers_match,
    extract_answer,
    gsm8k_reward_fn,
    math_reward_fn,
    parse_gsm8k_reference,
    parse_number,
)
from rollflow.rewards.protocol import reward_fn_name
from rollflow.rewards.runner import AsyncRewardRunner, RewardOutcome, RewardStats
from rollflow.rewards.synthetic import synthetic_reward_fn

__all__ = [
    "AsyncRewardRunner",
    "RewardOutcome",
    "RewardStats",
    "answers_match",
    "extract_answer",
    "gsm8k_reward_fn",
    "math_reward_fn",
    "parse_gsm8k_reference",
    "parse_number",
    "reward_fn_name",
    "synthetic_reward_fn",
]
