"""bounded_supply_warning: a bounded rollout too small for the trainer is reported at start-up."""

from __future__ import annotations

import pytest

from rollflow.api.config import ExperimentConfig
from rollflow.rollout.supply import bounded_supply_warning


def _cfg(max_epochs: int | None, batch: int = 4, steps: int = 10) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.rollout.max_epochs, cfg.train.batch_size, cfg.train.steps = max_epochs, batch, steps
    return cfg


def test_smaller_than_one_batch_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="rollflow.rollout.supply"):
        message = bounded_supply_warning(_cfg(max_epochs=1), n_rows=3)
    assert message is not None and message in caplog.text
    assert "at most 3 groups (3 prompts x rollout.max_epochs=1)" in message
    assert "one training batch needs 4" in message and "cannot make a single step" in message


def test_enough_for_some_steps_only_is_reported() -> None:
    message = bounded_supply_warning(_cfg(max_epochs=2, batch=4, steps=10), n_rows=9)  # 18 groups
    assert message is not None and "enough for 4 of train.steps=10 steps" in message


@pytest.mark.parametrize(("max_epochs", "n_rows"), [(None, 1), (1, 40), (4, 10)])
def test_enough_or_unbounded_says_nothing(max_epochs: int | None, n_rows: int) -> None:
    assert bounded_supply_warning(_cfg(max_epochs=max_epochs), n_rows=n_rows) is None


def test_a_curriculum_set_in_a_bounded_run_counts_its_skips() -> None:
    cfg = _cfg(max_epochs=4, batch=4, steps=10)  # 10 rows x 4 epochs = 40 groups, exactly enough
    assert cfg.rollout.curriculum_probs() == (0.0, 0.0)  # off by default
    assert bounded_supply_warning(cfg, n_rows=10) is None
    cfg.rollout.skip_solved_prob = 0.5  # 10 + 10 x 3 x 0.5 = 25 groups: 6 of 10 steps
    message = bounded_supply_warning(cfg, n_rows=10)
    assert message is not None and "enough for 6 of train.steps=10 steps" in message
    assert "rollout.skip_solved_prob/skip_unsolved_prob to 0" in message
