"""``dataset.kind: reasoning_gym``: any reasoning-gym generator as rollflow's prompts, checked up front.

What it is. reasoning-gym (PyPI ``reasoning-gym``) holds 100+ procedural generators, each with its own
verifier ``score_answer``. ``dataset.reasoning_gym`` names one generator (``task``), its parameters
(``params``, the target setting), an optional easier setting for the warm start
(``warm_start_params``), the sizes and the seed. The rows:

    generator  G = create_dataset(task, size = size + eval_size, seed = seed, **params)
    held out   = G[0 .. eval_size - 1]
    train      = G[eval_size .. size + eval_size - 1], less any question also held out

so a held-out question is never a training prompt, and the same config gives the same rows. Each row
carries ``rg_spec`` (a JSON string of task, params, size and seed) and ``rg_index``; the reward
(``rollflow.rewards.reasoning_gym``) rebuilds ``G`` from them in the reward worker and scores the
completion with ``G.score_answer(completion, G[rg_index])``: nothing is pickled.

``check_config(cfg)`` (run by the loader before anything is drawn, and by the reward on first use)
fails with a named error, before any step: ``ReasoningGymTaskError`` for an unknown generator (it lists
them), ``ReasoningGymParamError`` for an unknown parameter (it lists the generator's own) or a value
the generator refuses, ``ReasoningGymDataError`` when the generator needs a data file the installed
wheel does not ship (each generator is asked for one row of both settings), and
``ReasoningGymMissingError`` when the package is not installed.

``warm_start_task(cfg)`` is the family the tiny model's warm start trains on
(``rollflow.data.tasks`` protocol): the easier setting's questions with their answers as labels.

The generator itself (``Spec``, ``generator``) and the named errors live with the reward
(``rollflow.rewards.reasoning_gym``), which must stay importable without the rest of rollflow.

What it is not: the reward or a reimplementation of any generator.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollflow.api.config import ReasoningGymConfig
from rollflow.rewards.reasoning_gym import (
    INDEX_FIELD,
    SPEC_FIELD,
    ReasoningGymDataError,
    ReasoningGymMissingError,
    ReasoningGymParamError,
    ReasoningGymTaskError,
    Spec,
    generator,
    param_names,
    target_spec,
    task_names,
    warm_start_spec,
)

__all__ = [
    "ReasoningGymDataError",
    "ReasoningGymMissingError",
    "ReasoningGymParamError",
    "ReasoningGymTaskError",
    "Spec",
    "check_config",
    "entry",
    "param_names",
    "reasoning_gym_rows",
    "task_names",
    "warm_start_task",
]


def check_config(cfg: ReasoningGymConfig) -> None:
    """Build both settings and draw one row of each; raise the named errors of the module docstring."""
    generator(target_spec(cfg))
    if cfg.warm_start_params is not None:
        generator(warm_start_spec(cfg))


def entry(spec_json: str, index: int) -> dict[str, Any]:
    """Row ``index`` of the generator ``spec_json`` names (the reward worker's lookup)."""
    return generator(Spec.from_json(spec_json))[index]  # type: ignore[no-any-return]


def reasoning_gym_rows(cfg: ReasoningGymConfig, split: str) -> list[dict[str, Any]]:
    """The ``"train"`` or ``"test"`` rows of the module docstring, in the loader's row format."""
    check_config(cfg)
    spec = target_spec(cfg)
    ds = generator(spec)
    held_out = range(cfg.eval_size)
    if split == "test":
        indices: Sequence[int] = held_out
    else:
        seen = {ds[i]["question"] for i in held_out}
        indices = [i for i in range(cfg.eval_size, spec.size) if ds[i]["question"] not in seen]
    spec_json = spec.to_json()
    return [
        {
            "prompt_id": f"rg-{cfg.task}-{split}-{i}",
            "messages": [{"role": "user", "content": ds[i]["question"]}],
            "answer": str(ds[i]["answer"]),
            SPEC_FIELD: spec_json,
            INDEX_FIELD: i,
        }
        for i in indices
    ]


@dataclass(frozen=True)
class GymProblem:
    """A question and its reference answer (``rollflow.data.tasks.SyntheticProblem``)."""

    text: str
    answer: str


class WarmStartTask:
    """A reasoning-gym setting as a warm-start family (the ``rollflow.data.tasks.SyntheticTask`` protocol):
    the easier setting's questions, labelled with their reference answers."""

    MIN_WARM_START_STEPS = 500
    warm_start_example = None  # trained on question + answer (no conversations, no probe)
    warm_start_probe = None

    def __init__(self, cfg: ReasoningGymConfig) -> None:
        self.cfg = cfg
        ds = generator(warm_start_spec(cfg))
        self.pool = tuple(GymProblem(e["question"], str(e["answer"])) for e in ds)
        self.MAX_ANSWER_CHARS = max(len(p.answer) for p in self.pool)

    def problem_pool(self, split: str) -> Sequence[GymProblem]:
        return self.pool

    def warm_start_pool(self) -> Sequence[GymProblem]:
        return self.pool

    def warm_start_label(self, problem: GymProblem, rng: random.Random, p_correct: float) -> str:
        del rng, p_correct
        return problem.answer

    def sample_problems(self, split: str, n: int, *, seed: int) -> list[GymProblem]:
        return random.Random(f"rollflow-rg:{split}:{seed}").sample(list(self.pool), n)

    def problem_row(self, problem: GymProblem, split: str) -> dict[str, Any]:
        return {"prompt_id": problem.text, "messages": [{"role": "user", "content": problem.text}],
                "answer": problem.answer}  # fmt: skip


def warm_start_task(cfg: ReasoningGymConfig) -> WarmStartTask:
    """The warm-start family of ``cfg`` (``rollflow.models.bootstrap``)."""
    return WarmStartTask(cfg)
