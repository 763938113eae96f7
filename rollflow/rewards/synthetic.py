"""The synthetic task's reward: exact match of the completion with the sum.

What it is: ``synthetic_reward_fn(prompt, completion, answer)`` is 1.0 when the completion, with
surrounding whitespace stripped, is exactly the reference (``"47"``), else 0.0. The tiny model answers
with the digits and ``<|im_end|>`` (skipped when decoding), so anything else - extra text, a second
number, a missing digit - is wrong. Strict on purpose: the demo measures whether the policy learned
the format and the carry, not whether a parser could rescue it.

What it is not: a math verifier (see ``rollflow.rewards.math``) or the task itself
(``rollflow.data.synthetic``).
"""

from __future__ import annotations

from typing import Any


def synthetic_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """1.0 if ``completion.strip() == answer.strip()``, else 0.0. ``prompt`` and ``data`` are unused."""
    del prompt, data
    if answer is None:
        return 0.0
    return 1.0 if completion.strip() == str(answer).strip() else 0.0
