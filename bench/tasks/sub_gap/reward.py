"""The reward of the outside task ``sub_gap``, written as a user writes one: a plain function named in the
config as ``bench.tasks.sub_gap.reward:sub_gap_reward_fn``.

What it is. The contract rollflow accepts for ``module:function`` rewards (rollflow/rewards/protocol.py)::

    sub_gap_reward_fn(prompt, completion, answer, **data) -> float

``prompt`` is the last user message (``"73-21"``), ``completion`` the decoded completion with special
tokens skipped (so no ``</s>``), ``answer`` the row's ``solution`` field (``dataset.answer_field``) and
``data`` the row's other columns (here ``kind``). The reward is 1.0 when the stripped completion is the
answer, else 0.0: sparse, and strict - ``"52 "`` is right, ``"52\\n52"`` or ``"052"`` is not.

What it is not: part of rollflow. It imports nothing at all, so TRL's venv imports the same function
(``bench/peer_trl.py``) and the two systems are scored by one reward.
"""

from __future__ import annotations

from typing import Any


def sub_gap_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """1.0 if ``completion.strip() == answer.strip()``, else 0.0; ``prompt`` and ``data`` are unused."""
    del prompt, data
    return 1.0 if completion.strip() == str(answer).strip() else 0.0
