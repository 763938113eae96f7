"""The reward of ``dataset.kind: reasoning_gym``: the generator's own verifier, run in the reward workers.

What it is: ``reasoning_gym_reward(prompt, completion, answer, rg_spec, rg_index, **data)`` rebuilds the
generator that ``rg_spec`` names (a JSON string of task, params, size, seed; ``Spec``; cached per worker
process by ``generator``) and returns ``G.score_answer(completion.strip(), G[rg_index])``, a score in
[0, 1] that reasoning-gym's authors wrote for their own task. Rows carry ``rg_spec``/``rg_index``
(``rollflow.data.reasoning_gym``), so nothing is pickled and the worker needs only the import string
``rollflow.rewards.reasoning_gym:reasoning_gym_reward``. ``generator`` is also where a setting is checked:
the named errors below, raised at config validation (``rollflow.data.reasoning_gym.check_config``).

This module imports only reasoning-gym and ``rollflow.api`` (light), so the TRL peer's venv can import the
same reward (``bench/peer_trl.py``).

What it is not: a verifier of its own; a row without ``rg_spec`` (another dataset kind) is an error.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from rollflow.api.config import ReasoningGymConfig
from rollflow.api.errors import ConfigError

SPEC_FIELD, INDEX_FIELD = "rg_spec", "rg_index"
_CONFIG_FIELDS_NOT_PARAMS = ("seed", "size")  # set by dataset.reasoning_gym.seed / size, not params


class ReasoningGymMissingError(ConfigError):
    """dataset.kind=reasoning_gym but the reasoning-gym package is not installed."""


class ReasoningGymTaskError(ConfigError):
    """dataset.reasoning_gym.task names no reasoning-gym generator."""


class ReasoningGymParamError(ConfigError):
    """A parameter the generator does not have, or a value it refuses."""


class ReasoningGymDataError(ConfigError):
    """The generator needs a data file that the installed reasoning-gym wheel does not ship."""


def _rg() -> Any:
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError as exc:
        raise ReasoningGymMissingError(
            "dataset.kind", "reasoning_gym needs the reasoning-gym package: pip install reasoning-gym==0.1.25"
        ) from exc
    return reasoning_gym


def task_names() -> list[str]:
    """Every generator name of the installed reasoning-gym."""
    return sorted(_rg().factory.DATASETS)


def param_names(task: str) -> list[str]:
    """The parameters of generator ``task`` (its config dataclass' fields, less seed and size)."""
    datasets = _rg().factory.DATASETS
    if task not in datasets:
        raise ReasoningGymTaskError(
            "dataset.reasoning_gym.task",
            f"{task!r} is not a reasoning-gym generator; choose one of: " + ", ".join(sorted(datasets)),
        )
    config_cls = datasets[task][1]
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in _CONFIG_FIELDS_NOT_PARAMS]


@dataclass(frozen=True)
class Spec:
    """One generator setting: what the reward worker needs to rebuild the same rows."""

    task: str
    params: tuple[tuple[str, Any], ...]
    size: int
    seed: int

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "params": dict(self.params), "size": self.size, "seed": self.seed},
                          sort_keys=True)  # fmt: skip

    @staticmethod
    def from_json(text: str) -> Spec:
        d = json.loads(text)
        return Spec(d["task"], _frozen(d["params"]), int(d["size"]), int(d["seed"]))


def _frozen(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Params as a hashable, ordered tuple (lists become tuples; JSON brings them back as lists)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


def target_spec(cfg: ReasoningGymConfig) -> Spec:
    """The RL and held-out setting: ``size + eval_size`` rows of ``params``."""
    return Spec(cfg.task, _frozen(cfg.params), cfg.size + cfg.eval_size, cfg.seed)


def warm_start_spec(cfg: ReasoningGymConfig) -> Spec:
    """The warm start's setting: ``warm_start_params`` (or ``params``), on its own seed stream."""
    params = cfg.params if cfg.warm_start_params is None else cfg.warm_start_params
    return Spec(cfg.task, _frozen(params), cfg.size, cfg.seed + 7919)


@cache
def generator(spec: Spec) -> Any:
    """The reasoning-gym dataset of ``spec`` (cached per process: the reward worker builds it once).

    Raises:
        ReasoningGymTaskError, ReasoningGymParamError, ReasoningGymDataError: see the module docstring.
    """
    known = param_names(spec.task)
    unknown = [k for k, _ in spec.params if k not in known]
    if unknown:
        raise ReasoningGymParamError(
            "dataset.reasoning_gym.params",
            f"generator {spec.task!r} has no parameter {', '.join(map(repr, unknown))}; its parameters "
            f"are: {', '.join(known)}",
        )
    params = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.params}
    try:
        ds = _rg().create_dataset(spec.task, size=spec.size, seed=spec.seed, **params)
        ds[0]  # a generator that reads a data file fails here, not at the first training step
    except (FileNotFoundError, OSError) as exc:
        raise ReasoningGymDataError(
            "dataset.reasoning_gym.task",
            f"generator {spec.task!r} needs a data file the installed reasoning-gym wheel does not ship "
            f"({exc}); choose another task",
        ) from exc
    except (TypeError, ValueError, AssertionError) as exc:
        raise ReasoningGymParamError(
            "dataset.reasoning_gym.params", f"generator {spec.task!r} refused {params}: {exc!r}"
        ) from exc
    return ds


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
