"""``dataset.kind: reasoning_gym``: a real generator's rows, its own verifier as the reward, named errors.

Uses the installed reasoning-gym (``basic_arithmetic``, ``chain_sum``): rows from YAML and from ``RLRun``'s
dict config, the reward through the real reward worker pool (a subprocess that rebuilds the generator from
the row), and the errors for an unknown task and an unknown or refused parameter.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from rollflow.api.config import DatasetConfig, ReasoningGymConfig
from rollflow.configuration.loader import load_config
from rollflow.data.loader import load_prompts
from rollflow.data.reasoning_gym import ReasoningGymParamError, ReasoningGymTaskError

pytest.importorskip("reasoning_gym")

PARAMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
YAML = """
dataset:
  kind: reasoning_gym
  reasoning_gym:
    task: basic_arithmetic
    params: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}
    warm_start_params: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}
    size: 40
    eval_size: 12
    seed: 5
"""


def _dataset(**kw: object) -> DatasetConfig:
    return DatasetConfig(kind="reasoning_gym", reasoning_gym=ReasoningGymConfig(**kw))  # type: ignore[arg-type]


def test_yaml_config_gives_disjoint_deterministic_rows_and_the_verifier_as_reward(tmp_path: Path) -> None:
    path = tmp_path / "rg.yaml"
    path.write_text(YAML)
    cfg = load_config(path)
    ds = cfg.dataset
    assert (
        ds.reward_fn == "rollflow.rewards.reasoning_gym:reasoning_gym_reward"
    )  # the default follows the kind
    train, test = load_prompts(ds, ds.train_split), load_prompts(ds, ds.eval_split)
    assert len(test) == 12 and 0 < len(train) <= 40
    assert not {r["messages"][0]["content"] for r in train} & {r["messages"][0]["content"] for r in test}
    assert test[0]["messages"][0]["content"].startswith("Calculate ")
    assert load_prompts(ds, ds.eval_split) == test  # the same config, the same rows


def test_the_generators_own_verifier_scores_in_the_reward_worker() -> None:
    from rollflow.rewards.runner import AsyncRewardRunner

    rows = load_prompts(_dataset(task="chain_sum", params={}, size=4, eval_size=3, seed=2), "test")
    runner = AsyncRewardRunner(
        "rollflow.rewards.reasoning_gym:reasoning_gym_reward", max_workers=1, timeout_s=60
    )

    async def score() -> list[float]:
        out = []
        for r in rows:
            extra = {"rg_spec": r["rg_spec"], "rg_index": r["rg_index"]}
            prompt = r["messages"][0]["content"]
            right = await runner.ascore(prompt, f" {r['answer']} ", r["answer"], **extra)
            wrong = await runner.ascore(prompt, str(int(r["answer"]) + 1), r["answer"], **extra)
            assert right.error is None and wrong.error is None, (right, wrong)
            out += [right.score, wrong.score]
        return out

    try:
        assert asyncio.run(score()) == [1.0, 0.0] * len(rows)
    finally:
        runner.close()


def test_unknown_task_names_the_valid_ones() -> None:
    with pytest.raises(
        ReasoningGymTaskError, match="dataset.reasoning_gym.task.*'basic_arithemtic'.*chain_sum"
    ):
        load_config(
            data={"dataset": {"kind": "reasoning_gym", "reasoning_gym": {"task": "basic_arithemtic"}}}
        )


def test_unknown_or_refused_parameter_names_the_generators_own() -> None:
    with pytest.raises(ReasoningGymParamError, match="no parameter 'max_digit'.*max_digits"):
        load_prompts(_dataset(task="basic_arithmetic", params={**PARAMS, "max_digit": 3}), "train")
    with pytest.raises(ReasoningGymParamError, match="refused"):
        load_prompts(_dataset(task="basic_arithmetic", params={"min_terms": -1}), "train")


def test_rlrun_dict_config_and_the_warm_start_family_use_the_easier_setting() -> None:
    from flows.session import RLRun
    from rollflow.data.reasoning_gym import warm_start_task
    from rollflow.data.synthetic import reasoning_gym_key, task_module

    run = RLRun(config={"dataset.kind": "reasoning_gym", "dataset.reasoning_gym.task": "basic_arithmetic",
                        "dataset.reasoning_gym.params": PARAMS, "dataset.reasoning_gym.size": 20,
                        "dataset.reasoning_gym.warm_start_params": {**PARAMS, "max_digits": 1}})  # fmt: skip
    rg = run.settings.dataset.reasoning_gym
    assert run.settings.dataset.reward_fn.endswith("reasoning_gym:reasoning_gym_reward")
    typed = RLRun(dataset=rg)  # the config object itself, as the dataset
    assert typed.settings.dataset.kind == "reasoning_gym" and typed.settings.dataset.reasoning_gym == rg
    family = task_module(reasoning_gym_key(rg))  # what model.bootstrap_tiny warm-starts on
    assert family.warm_start_pool() == warm_start_task(rg).warm_start_pool()
    # the easier setting: one-digit operands only
    assert all(len(n) == 1 for p in family.warm_start_pool() for n in re.findall(r"\d+", p.text))
    assert all(p.answer == family.warm_start_label(p, None, 1.0) for p in family.warm_start_pool()[:5])  # type: ignore[arg-type]


def test_a_generator_whose_data_file_is_missing_fails_at_config_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some generators read .json/.gz/.csv files a wheel may not ship: the first row is drawn at
    load_config, and a missing file is a named error there, not a crash at the first training step."""
    import reasoning_gym

    from rollflow.data.reasoning_gym import ReasoningGymDataError

    def missing(name: str, **kw: object) -> object:
        raise FileNotFoundError(2, "No such file or directory", f"reasoning_gym/data/{name}.json.gz")

    monkeypatch.setattr(reasoning_gym, "create_dataset", missing)
    tree = {"dataset": {"kind": "reasoning_gym", "reasoning_gym": {"task": "count_bits", "seed": 99}}}
    with pytest.raises(ReasoningGymDataError, match="count_bits.*data file.*count_bits.json.gz"):
        load_config(data=tree)
