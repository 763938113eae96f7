"""Groups -> padded batch; micro-batch selection; the no-pickle wire format."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import make_group

from rollflow.api.errors import TrainerError
from rollflow.training.batching import TrainBatch, build_batch
from storage.schema import TrajectoryGroup, TrajectoryRow


def _row(gid: str, i: int, ids: list[int], mask: list[int], lp: list[float], reward: float) -> TrajectoryRow:
    return TrajectoryRow.build(
        traj_id=f"{gid}-{i}",
        group_id=gid,
        prompt_id="p",
        input_ids=ids,
        loss_mask=mask,
        logprobs=lp,
        versions=[3 if m else -1 for m in mask],
        reward=reward,
        finish_reason="stop",
    )


def test_build_batch_pads_right_and_masks() -> None:
    g1 = TrajectoryGroup("a", "p", [_row("a", 0, [5, 6, 7], [0, 1, 1], [0, -1, -2], 1.0)])
    g2 = TrajectoryGroup(
        "b",
        "p",
        [
            _row("b", 0, [5, 8], [0, 1], [0, -0.5], 0.0),
            _row("b", 1, [5, 9, 9, 9, 9], [0, 1, 1, 0, 1], [0, -1, -1, 0, -3], 0.5),
        ],
    )
    b = build_batch([g1, g2], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 0, 0], [5, 8, 0, 0, 0], [5, 9, 9, 9, 9]]
    assert b.attention_mask.sum(-1).tolist() == [3, 2, 5]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 0, 1]]
    assert b.behav_logp[2].tolist() == [0, -1, -1, 0, -3]
    assert b.versions.tolist() == [[-1, 3, 3, -1, -1], [-1, 3, -1, -1, -1], [-1, 3, 3, -1, 3]]  # -1 off loss
    assert b.rewards.tolist() == [1.0, 0.0, 0.5]
    assert b.group_index.tolist() == [0, 1, 1]
    assert [(g.group_id, g.rows, g.n_tokens, g.head_version) for g in b.groups] == [
        ("a", (0,), 3, 3),
        ("b", (1, 2), 7, 3),
    ]
    assert b.n_tokens == 10 and b.n_loss_tokens == 6

    sub = b.select(b.rows_of([0]))  # trimmed to its own longest row
    assert sub.input_ids.shape == (1, 3) and sub.loss_mask.tolist() == [[0, 1, 1]]
    assert sub.versions.tolist() == [[-1, 3, 3]]


def test_first_token_is_never_a_loss_token(caplog: pytest.LogCaptureFixture) -> None:
    g = TrajectoryGroup("a", "p", [_row("a", 0, [5, 6], [1, 1], [-1, -1], 1.0)])
    with caplog.at_level(logging.WARNING):
        b = build_batch([g])
    assert b.loss_mask.tolist() == [[0, 1]] and b.behav_logp.tolist() == [[0, -1]]
    assert "loss_mask[0] = 1" in caplog.text


def test_malformed_row_raises() -> None:
    g = TrajectoryGroup("a", "p", [_row("a", 0, [5, 6], [0, 1], [0, -1], 1.0)])
    g.rows[0].logprobs = [0.0]
    with pytest.raises(TrainerError, match="lengths differ"):
        build_batch([g])


def test_bytes_roundtrip_is_exact() -> None:
    b = build_batch([make_group("g1", n=3), make_group("g2", n=2)])
    again = TrainBatch.from_bytes(b.to_bytes())
    for name in (
        "input_ids",
        "attention_mask",
        "loss_mask",
        "behav_logp",
        "versions",
        "rewards",
        "group_index",
    ):
        assert torch.equal(getattr(again, name), getattr(b, name)), name
    assert again.groups == b.groups
