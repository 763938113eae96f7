"""A hub-style dataset with several configs: one must be named, and naming none is a clear error.

The dataset is a local directory laid out as a hub repository (a README whose YAML header declares two
configs, ``main`` and ``socratic``, like ``openai/gsm8k``); ``datasets`` resolves it with the same code
path as a hub name, offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollflow.api.config import DatasetConfig
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config
from rollflow.data import load_prompts

ROOT = Path(__file__).resolve().parents[2]

README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train.jsonl
---
"""


@pytest.fixture
def two_config_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "gsm8k_like"
    for name, question in (("main", "What is 2 + 3?"), ("socratic", "How many? What is 2 + 3?")):
        (root / name).mkdir(parents=True)
        row = {"question": question, "answer": "2 + 3 = 5\n#### 5"}
        (root / name / "train.jsonl").write_text(json.dumps(row) + "\n")
    (root / "README.md").write_text(README)
    return root


def test_no_config_named_lists_the_configs(two_config_dataset: Path) -> None:
    cfg = DatasetConfig(kind="hub", path=str(two_config_dataset), answer_format="gsm8k")
    with pytest.raises(ConfigError, match=r"dataset\.hub_config") as info:
        load_prompts(cfg, "train")
    assert "main, socratic" in str(info.value) and "is not set" in str(info.value)


def test_a_config_it_does_not_have_lists_them_too(two_config_dataset: Path) -> None:
    cfg = DatasetConfig(kind="hub", path=str(two_config_dataset), hub_config="mian", answer_format="gsm8k")
    with pytest.raises(ConfigError, match="'mian'") as info:
        load_prompts(cfg, "train")
    assert "main" in str(info.value) and "socratic" in str(info.value)


def test_the_named_config_loads(two_config_dataset: Path) -> None:
    cfg = DatasetConfig(
        kind="hub", path=str(two_config_dataset), hub_config="socratic", answer_format="gsm8k"
    )
    (row,) = load_prompts(cfg, "train")
    assert row["messages"][-1]["content"].startswith("How many?") and row["answer"] == "5"


def test_the_gsm8k_config_names_its_hub_config() -> None:
    cfg = load_config(str(ROOT / "configs" / "gsm8k_qwen.yaml"))
    assert cfg.dataset.path == "openai/gsm8k" and cfg.dataset.hub_config == "main"
