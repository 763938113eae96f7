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
