"""Misbehaving reward functions for the runner tests (importable by name in worker processes)."""

from __future__ import annotations

import os
import time
from typing import Any


def echo_len_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """len(completion) + data['bonus'] (default 0): shows which arguments arrived."""
    return float(len(completion) + data.get("bonus", 0))


def raising_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    raise ValueError(f"cannot score {completion!r}")


def hanging_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """Hangs when the completion says so, else scores 1.0."""
    if completion == "hang":
        time.sleep(3600)
    return 1.0


def sleepy_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    time.sleep(float(data.get("sleep_s", 0.2)))
    return 1.0


def nan_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    return float("nan")


def none_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    return None  # type: ignore[return-value]


def dying_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """Kills its own worker process (as a segfault in a C extension would)."""
    if completion == "die":
        os._exit(3)
    return 1.0


def pid_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    return float(os.getpid())


def dies_once_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """Kills its worker the first time (creating ``data['marker']``), then scores 1.0: a transient crash."""
    marker = data["marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(9)
    return 1.0


def huge_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    """Returns ``float(completion)``: "1e39", "1e308", "inf", "nan", "-1e7" or a sane "0.5"."""
    return float(completion)


def string_reward_fn(prompt: str, completion: str, answer: str, **data: Any) -> float:
    return "1.0"  # type: ignore[return-value]
