"""Config trees that are small on disk but huge or deep once loaded, and floats that are not finite.

A 20,000-level YAML file used to raise a raw RecursionError; an alias bomb in ``workflow_kwargs`` loaded
at once and was then expanded by redaction (10^6 leaves at six levels of x10). Both are ``ConfigError``
naming the key now, and so are ``.inf`` / ``.nan`` floats (``train.lora.alpha``,
``rollout.generation.temperature``), which would reach the servers as NaN weights or NaN logprobs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rollflow.api.config import ExperimentConfig, LoraConfig
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import flat_params, load_config, to_yaml
from rollflow.configuration.redact import redact_tree


def _bomb_yaml(levels: int = 6, width: int = 10) -> str:
    """``l0: &l0 [x, x, ...]``, ``l1: &l1 [*l0, *l0, ...]``, ...: ``width ** levels`` leaves once copied."""
    lines = ["rollout:", "  workflow_kwargs:"]
    lines.append(f"    l0: &l0 [{', '.join(['x'] * width)}]")
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb_yaml())
    assert path.stat().st_size < 1000
    with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
        load_config(path)
    with pytest.raises(ConfigError, match="rollout.workflow_kwargs"):  # also through data= (RLRun, flows)
        load_config(data=yaml.safe_load(_bomb_yaml()))
    bomb = yaml.safe_load(_bomb_yaml())["rollout"]["workflow_kwargs"]
    with pytest.raises(ConfigError, match="expands"):
        redact_tree(bomb)
    cfg = ExperimentConfig()
    cfg.rollout.workflow_kwargs = bomb  # a config built in code skips the loader: redaction checks too
    for log in (flat_params, to_yaml):
        with pytest.raises(ConfigError, match="rollout.workflow_kwargs"):
            log(cfg)
    small = yaml.safe_load(_bomb_yaml(levels=3))  # 10^3 leaves: a legitimate shared list is fine
    assert load_config(data=small).rollout.workflow_kwargs["l2"][0][0] == ["x"] * 10


def test_deep_yaml_is_a_config_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("rollout:\n  workflow_kwargs:\n    a: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match="nests too deeply|nested deeper"):
        load_config(path)
    nested = "[" * 100 + "]" * 100  # loads, but deeper than the limit (64)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_config(overrides=[f"rollout.workflow_kwargs={{a: {nested}}}"])
    recursive = tmp_path / "self.yaml"  # a list that contains itself
    recursive.write_text("rollout:\n  workflow_kwargs:\n    a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="refers to itself|nested deeper"):
        load_config(recursive)


def test_check_tree_counts_aliases_at_every_use() -> None:
    from rollflow.configuration.tree_limits import MAX_NODES, check_tree

    leaf = list(range(99))  # 1 + 99 = 100 nodes
    check_tree([leaf] * (MAX_NODES // 100 - 1))  # 1 + 999 * 100 = 99,901 nodes: fine
    with pytest.raises(ConfigError, match="expands"):
        check_tree([leaf] * (MAX_NODES // 100 + 1))


@pytest.mark.parametrize(
    "override",
    [
        "train.lora.alpha=.inf",
        "train.lora.alpha=.nan",
        "train.lora.alpha=1e308",
        "rollout.generation.temperature=.inf",
        "rollout.generation.temperature=1e39",
        "train.lr=.nan",
        "rollout.generation.stop_token_ids=[-1]",
    ],
)
def test_non_finite_or_out_of_range_numbers_are_refused(override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override])


def test_a_config_built_in_code_refuses_an_infinite_lora_alpha() -> None:
    with pytest.raises(ConfigError, match=r"train\.lora\.alpha"):
        LoraConfig(rank=4, alpha=float("inf"))
