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

What it is not: the reward (``rollflow.rewards.reasoning_gym``) or a reimplementation of any generator.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
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
