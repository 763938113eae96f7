"""``RLRun``'s model and experiment arguments (flows/session.py): a directory, a tiny model to build, or a
hub id as ``transformers`` takes it; and an experiment of its own unless one is given.

No network here: a hub id that is not in the hub cache fails with huggingface_hub's own offline error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.session import RLRun, SessionError, default_experiment, model_settings


def test_an_existing_directory_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert model_settings(tmp_path / "m", bootstrap=True) == {
        "path": str((tmp_path / "m").resolve()),
        "bootstrap_tiny": False,  # never build over a directory that is there
    }


def test_a_missing_directory_with_bootstrap_keeps_the_bootstrap(tmp_path: Path) -> None:
    run = RLRun(model=tmp_path / "tiny", config={"model.bootstrap_tiny": True})
    assert run.settings.model.bootstrap_tiny is True
    assert run.settings.model.path == str((tmp_path / "tiny").resolve())


def test_a_yaml_config_that_bootstraps_builds_at_the_given_path(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    run = RLRun(model=tmp_path / "tiny", config=root / "configs" / "tiny_cpu.yaml")
    assert run.settings.model.bootstrap_tiny is True  # the README's example on a fresh clone
    assert run.settings.experiment == "tiny-arith"  # the YAML names one: kept


def test_neither_a_directory_nor_a_hub_id_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="bootstrap_tiny"):
        model_settings(tmp_path / "no" / "such", bootstrap=False)


def test_a_hub_id_goes_to_the_hub_and_offline_fails_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # no ./Qwen directory to mistake it for
    with pytest.raises(LocalEntryNotFoundError, match="HF_HUB_OFFLINE"):
        RLRun(model="Qwen/Qwen2.5-0.5B-Instruct")


def test_a_run_from_python_gets_an_experiment_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "my-model").mkdir()
    assert RLRun(model=tmp_path / "my-model").settings.experiment == "rlrun-my-model"
    assert RLRun().settings.experiment == default_experiment(None) == "rlrun-tiny"
    assert RLRun(config={"experiment": "mine"}).settings.experiment == "mine"
    assert RLRun(experiment="other", config={"experiment": "mine"}).settings.experiment == "other"
    assert default_experiment("Qwen/Qwen2.5 0.5B") == "rlrun-Qwen2.5-0.5B"
    assert RLRun().settings.trial == "rlrun"  # the prefix of its new trials (rlrun-<date>-<time>-<hex>)
