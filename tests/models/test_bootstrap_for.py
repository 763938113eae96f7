"""``bootstrap_for``: an experiment's tiny model is warm-started for the task its dataset trains on."""

from __future__ import annotations

from pathlib import Path

from rollflow.configuration.loader import load_config
from rollflow.models import read_marker
from rollflow.models.bootstrap import bootstrap_for, current_tiny_model


def test_bootstrap_for_uses_the_configured_task(tmp_path: Path) -> None:
    small = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.warm_start_steps=3"]
    cfg = load_config("configs/tiny_hard.yaml", [*small, f"model.path={tmp_path / 'hard'}"])
    assert cfg.dataset.synthetic.task == "add_gap"
    out = bootstrap_for(cfg)
    assert read_marker(out)["key"]["task"] == "add_gap"  # type: ignore[index]
    smoke = load_config("configs/tiny_cpu.yaml", [*small, f"model.path={tmp_path / 'smoke'}"])
    assert read_marker(bootstrap_for(smoke))["key"]["task"] == "add_habit"  # type: ignore[index]


def test_current_tiny_model_finds_only_the_same_build(tmp_path: Path) -> None:
    small = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.warm_start_steps=3"]
    cfg = load_config("configs/tiny_hard.yaml", [*small, f"model.path={tmp_path / 'm'}"])
    assert current_tiny_model(cfg) is None  # nothing there yet, and it builds nothing
    assert not (tmp_path / "m").exists()
    built = bootstrap_for(cfg)
    assert current_tiny_model(cfg) == built
    other_seed = load_config("configs/tiny_hard.yaml", [*small, f"model.path={built}", "seed=7"])
    other_size = load_config(
        "configs/tiny_hard.yaml", [*small[:2], "model.tiny.warm_start_steps=4", f"model.path={built}"]
    )
    assert current_tiny_model(other_seed) is None
    assert current_tiny_model(other_size) is None
    assert read_marker(built)["key"]["seed"] == cfg.seed  # type: ignore[index]  # left as it was
