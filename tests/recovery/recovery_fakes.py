"""A slow reward function for the recovery tests (importable by name in reward worker processes)."""

from __future__ import annotations

import time
from typing import Any


def slow_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """Sleeps ``float(completion)`` seconds, then scores 1.0: a call that is still running when killed."""
    time.sleep(float(completion))
    return 1.0
