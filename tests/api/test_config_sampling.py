"""Filtered sampling (top-p / top-k / min-p) and the decoupled loss are refused together.

The server reports behaviour logprobs of the unfiltered distribution, so exp(prox - behav) is not the
importance weight when the sampler filtered; config validation names the key and both ways out.
"""

from __future__ import annotations

import pytest

from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config


@pytest.mark.parametrize("override", ["rollout.generation.top_p=0.9", "rollout.generation.top_k=20",
                                      "rollout.generation.min_p=0.05"])  # fmt: skip
def test_filtered_sampling_with_decoupled_loss_is_refused(override: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])  # use_decoupled_loss is on by default
    assert err.value.key == "train.use_decoupled_loss"
    text = str(err.value)
    assert override.rsplit(".", 1)[-1] in text  # names the filter that is on
    assert "train.use_decoupled_loss=false" in text and "top_p=1.0" in text  # and both fixes


def test_filtered_sampling_without_decoupled_loss_is_accepted() -> None:
    cfg = load_config(overrides=["rollout.generation.top_p=0.9", "train.use_decoupled_loss=false"])
    assert cfg.rollout.generation.top_p == 0.9 and not cfg.train.use_decoupled_loss


def test_unfiltered_sampling_keeps_the_decoupled_loss() -> None:
    cfg = load_config(overrides=["rollout.generation.temperature=0.7"])
    assert cfg.train.use_decoupled_loss
