"""The reward of ``dataset.kind: reasoning_gym``: the generator's own verifier, run in the reward workers.

What it is: ``reasoning_gym_reward(prompt, completion, answer, rg_spec, rg_index, **data)`` rebuilds the
generator that ``rg_spec`` names (a JSON string of task, params, size, seed; cached per worker process)
and returns ``G.score_answer(completion.strip(), G[rg_index])``, a score in [0, 1] that reasoning-gym's
authors wrote for their own task. Rows carry ``rg_spec``/``rg_index`` (``rollflow.data.reasoning_gym``),
so nothing is pickled and the worker needs only the import string
``rollflow.rewards.reasoning_gym:reasoning_gym_reward``.

What it is not: a verifier of its own; a row without ``rg_spec`` (another dataset kind) is an error.
"""

from __future__ import annotations

from typing import Any

from rollflow.data.reasoning_gym import Spec, generator


def reasoning_gym_reward(
    prompt: str, completion: str, answer: str, rg_spec: str | None = None, rg_index: int | None = None,
    **data: Any,
) -> float:  # fmt: skip
    """The generator's ``score_answer`` of ``completion`` for row ``rg_index`` (``prompt``, ``answer`` and
    ``data`` are unused: the verifier reads its own entry).

    Raises:
        ValueError: the row carries no ``rg_spec``/``rg_index`` (set dataset.kind=reasoning_gym).
    """
    del prompt, answer, data
    if rg_spec is None or rg_index is None:
        raise ValueError(
            "reasoning_gym_reward needs rows of dataset.kind=reasoning_gym (fields rg_spec, rg_index)"
        )
    ds = generator(Spec.from_json(rg_spec))
    return float(ds.score_answer(completion.strip(), ds[int(rg_index)]))
