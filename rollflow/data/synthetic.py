"""The built-in synthetic verifiable task: pick the family named by ``dataset.synthetic.task``, draw its prompts.

What it is. ``synthetic_rows(cfg, split)`` returns the ``cfg.n_train`` train or ``cfg.n_eval``
held-out rows of the family ``cfg.task`` (``rollflow.data.tasks``: ``add_habit``, ``add_gap``,
``shift_gap``, ``tool_lookup``); ``task_module(name)`` gives the family's module, which the warm start
(``rollflow.models.bootstrap``) trains from; a ``reasoning_gym_key`` names a reasoning-gym setting's
warm start (``rollflow.data.reasoning_gym.WarmStartTask``, the easier setting's questions). Every family keeps a fixed held-out split that its warm
start never sees; the draws are deterministic for ``(task, split, n, seed)``.

What it is not: a family (each lives in its own module) or a loader (``rollflow.data.loader``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rollflow.api.config import ReasoningGymConfig, SyntheticTaskConfig
from rollflow.data.tasks import Split, SyntheticTask, add_gap, add_habit, shift_gap, tool_lookup

REASONING_GYM_PREFIX = "reasoning_gym:"


def reasoning_gym_key(cfg: ReasoningGymConfig) -> str:
    """The warm-start task name of a reasoning-gym setting: ``task_module`` rebuilds it from this string
    (the bootstrap's marker records it, so another setting rebuilds the model)."""
    return REASONING_GYM_PREFIX + json.dumps(dataclasses.asdict(cfg), sort_keys=True)


def task_module(name: str) -> SyntheticTask:
    """The module of the synthetic task family ``name``.

    Raises:
        ValueError: an unknown name; the message lists the families.
    """
    if name.startswith(REASONING_GYM_PREFIX):  # a reasoning-gym setting's warm start (reasoning_gym_key)
        from rollflow.data.reasoning_gym import warm_start_task

        fields = json.loads(name[len(REASONING_GYM_PREFIX) :])
        return warm_start_task(ReasoningGymConfig(**fields))  # type: ignore[return-value]
    modules: dict[str, Any] = {
        "add_habit": add_habit, "add_gap": add_gap, "shift_gap": shift_gap, "tool_lookup": tool_lookup,
    }  # fmt: skip
    if name not in modules:
        raise ValueError(
            f"unknown synthetic task {name!r}; set dataset.synthetic.task to one of {sorted(modules)}"
        )
    return modules[name]  # type: ignore[no-any-return]


def synthetic_rows(cfg: SyntheticTaskConfig, split: Split) -> list[dict[str, Any]]:
    """The prompt set of a split: ``cfg.n_train`` train or ``cfg.n_eval`` held-out rows of ``cfg.task``."""
    task = task_module(cfg.task)
    n = cfg.n_train if split == "train" else cfg.n_eval
    return [task.problem_row(p, split) for p in task.sample_problems(split, n, seed=cfg.seed)]
