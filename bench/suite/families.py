"""The suite's families: which task, which config, dev or test, and the candidate defaults they run at.

What it is: ``FAMILIES`` (name -> ``Family``) and ``family_config(family, out_dir)``, the config file one
family runs from. A reasoning-gym family is written as a YAML config (``dataset.kind: reasoning_gym``,
the tiny model warm-started on ``warm_start_params``, the RL and held-out prompts from ``params``);
``add_gap`` is ``configs/tiny_hard.yaml`` and ``sub_gap`` ``bench/tasks/sub_gap/config.yaml``.
``candidate_overrides()`` puts every learning key (and the shard keys: the run names only its task) at
the config class's default, so values a shipped config was tuned with never reach the suite.

The split (docs/benchmarks.md, "The suite", written before any tuning):

* dev: ``add_gap`` and ``sub_gap`` (every default so far was tuned on them), ``basic_arithmetic``,
  ``count_bits``;
* test: ``chain_sum``, ``gcd``, ``products``: never run while choosing a default.

The warm-start settings are one step easier than the target (fewer terms, fewer digits, smaller
numbers), or the target itself with fewer warm-start steps. ``python -m bench.suite.run --calibrate``
checks each family before any learning run: the base must score 0.1-0.4 held out, and a group of
samples from it must reach at least ``LEARNABLE_REACHABLE`` of the problems it gets wrong (it prints
``base_acc``, the solved share and the reachable share, and writes them to the output's
``calibration.json``). A family that fails gets its setting (target or warm start) changed, and the
change is written down with the split. The settings below are the calibrated ones (docs/benchmarks.md
lists each try).

What it is not: the runner (``run.py``) or the report (``report.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

ROOT = Path(__file__).resolve().parents[2]
Split = Literal["dev", "test"]
WARM_START_STEPS = 1000  # the tiny model's warm-start steps on the easier setting (the default per family)
# The least share of the start's greedy-unsolved held-out problems that one of a group's samples must solve
# for a family to count as learnable (``bench.suite.run.reachability``). Set on the dev families alone:
# add_gap learnt at 0.012 (TRL: 0.217 of its unsolved problems in 90 s at ~600 completions/s) and
# basic_arithmetic did not at 0.000; reasoning-gym's longer prompts run ~5x fewer completions/s, hence 5x.
LEARNABLE_REACHABLE = 0.06

# every key the rule for defaults covers, plus the shard keys (a suite run names only its task)
LEARNING_KEYS = (
    "train.ppo_epochs",
    "train.lr_schedule",
    "train.eps_clip_higher",
    "rollout.max_staleness",
    "rollout.skip_solved_prob",
    "rollout.skip_unsolved_prob",
    "rollout.curriculum_max_skips",
    "rollout.dynamic_sampling",
    "rollout.shard_flush_rows",
    "rollout.shard_flush_seconds",
)


@dataclass(frozen=True)
class Family:
    name: str
    split: Split
    config: str | None = None  # a shipped config (repository-relative), else the reasoning-gym fields
    task: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    warm_start_params: dict[str, Any] = field(default_factory=dict)
    warm_start_steps: int = WARM_START_STEPS


_TWO = {"min_terms": 2, "max_terms": 2}
_PLUS_MINUS = {"operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False}


def _rg(
    name: str, split: Split, params: dict[str, Any], warm: dict[str, Any], *, steps: int = WARM_START_STEPS
) -> Family:
    """A reasoning-gym family named after its generator: target ``params``, warm start ``warm`` for ``steps``."""
    return Family(name, split, task=name, params=params, warm_start_params=warm, warm_start_steps=steps)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("add_gap", "dev", config="configs/tiny_hard.yaml"),
        Family("sub_gap", "dev", config="bench/tasks/sub_gap/config.yaml"),
        _rg("basic_arithmetic", "dev", {**_TWO, "min_digits": 1, "max_digits": 3, **_PLUS_MINUS},
            {**_TWO, "min_digits": 1, "max_digits": 1, **_PLUS_MINUS}),
        _rg("count_bits", "dev", {"min_n": 1, "max_n": 255}, {"min_n": 1, "max_n": 31}),
        _rg("chain_sum", "test", {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 1},
            {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 1}, steps=500),
        _rg("gcd", "test", {"min_value": 1, "max_value": 99}, {"min_value": 1, "max_value": 30}),
        _rg("products", "test", {**_TWO, "min_digits": 1, "max_digits": 2}, {**_TWO, "min_digits": 1, "max_digits": 2},
            steps=500),
    )
}  # fmt: skip


def select(names: list[str]) -> list[Family]:
    """Families by name, or every family of a split (``dev``, ``test``) or ``all``.

    Raises:
        SystemExit: an unknown name; the message lists the families.
    """
    out: list[Family] = []
    for n in names:
        if n == "all":
            out += FAMILIES.values()
        elif n in ("dev", "test"):
            out += [f for f in FAMILIES.values() if f.split == n]
        elif n in FAMILIES:
            out.append(FAMILIES[n])
        else:
            raise SystemExit(
                f"bench.suite: unknown family {n!r}; choose from dev, test, all, {', '.join(FAMILIES)}"
            )
    return list({f.name: f for f in out}.values())


def candidate_overrides() -> list[str]:
    """``key=value`` for every ``LEARNING_KEYS`` entry at the config class's default."""
    from rollflow.api.config import ExperimentConfig

    cfg = ExperimentConfig()
    out = []
    for key in LEARNING_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        out.append(
            f"{key}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"
        )
    return out


def _rg_tree(f: Family, size: int, eval_size: int) -> dict[str, Any]:
    """The YAML tree of a reasoning-gym family: tiny_hard's geometry, the task from the generator."""
    return {
        "experiment": f"suite-{f.name}",
        "trial": "suite",
        "seed": 1,
        "storage": {"root": "runs/storage", "local_cache": "runs/cache"},
        "model": {"path": f"runs/models/suite-{f.name}", "bootstrap_tiny": True,
                  "tiny": {"warm_start_steps": f.warm_start_steps}},
        "dataset": {"kind": "reasoning_gym", "reasoning_gym": {
            "task": f.task, "params": f.params, "warm_start_params": f.warm_start_params,
            "size": size, "eval_size": eval_size, "seed": 1234}},
        "rollout": {"group_size": 8, "max_concurrent_rollouts": 32,
                    "generation": {"max_new_tokens": 8, "temperature": 1.0}},
        "inference": {"backend": "local", "n_servers": "auto", "server_threads": "auto", "max_batch_size": 128},
        "train": {"steps": 100000, "batch_size": 16, "lr": 1.0e-4, "max_tokens_per_mb": 8192,
                  "checkpoint_every": 1, "resume_every": 10},
        "eval": {"every_n_versions": 25, "n_prompts": eval_size},
        "tracking": {"mlflow_tracking_uri": None},
    }  # fmt: skip


def family_config(f: Family, out_dir: Path, *, size: int = 2000, eval_size: int = 200) -> Path:
    """The config file family ``f`` runs from (written under ``out_dir`` for a reasoning-gym family)."""
    if f.config is not None:
        return ROOT / f.config
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{f.name}.yaml"
    header = f"# bench.suite family {f.name} ({f.split}); written by bench/suite/families.py\n"
    path.write_text(header + yaml.safe_dump(_rg_tree(f, size, eval_size), sort_keys=False))
    return path


def as_dict(f: Family) -> dict[str, Any]:
    return dataclasses.asdict(f)
