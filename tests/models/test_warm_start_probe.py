"""The warm-start probe's scoring: greedy accuracy and mean probability of each named token."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from rollflow.models.warm_start_probe import ProbeExample, probe, probe_examples


class _RepeatLast(torch.nn.Module):
    """Predicts that the next token repeats the current one (logit 10 for it, 0 for the rest)."""

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        logits = 10.0 * torch.nn.functional.one_hot(input_ids, 12).float()  # [N, T, V]
        return SimpleNamespace(logits=logits)


def test_scores_each_named_token_teacher_forced() -> None:
    model = _RepeatLast()
    model.train()
    examples: list[ProbeExample] = [
        ([5, 5, 7], {"same": 1, "other": 2}),  # 5 after 5: right; 7 after 5: wrong
        ([4, 4, 4, 9], {"same": 2, "other": 3}),  # a longer row: the shorter one is padded
    ]
    result = probe(model, examples, step=7, pad_id=0, pass_at=0.9)
    assert result.accuracy == {"same": 1.0, "other": 0.0}
    right = math.exp(10) / (math.exp(10) + 11)  # softmax of one logit 10 among 12
    assert result.probability["same"] == pytest.approx(right, rel=1e-5)
    assert result.probability["other"] == pytest.approx((1 - right) / 11, rel=1e-4)
    assert not result.passed and result.step == 7
    assert model.training  # left in the mode it was in
    assert result.as_dict()["accuracy"] == {"same": 1.0, "other": 0.0}
    assert "same 1.00" in str(result) and "not yet" in str(result)
    assert probe(model, examples[:1], step=0, pad_id=0, pass_at=0.0).passed
    same = [([5, 5], {"same": 1})]
    assert probe(model, same, step=0, pad_id=0, pass_at=0.99).passed
    sure_enough = probe(model, same, step=0, pad_id=0, pass_at=0.9999)  # greedy-right, p 0.9995: not enough
    assert sure_enough.accuracy == {"same": 1.0} and not sure_enough.passed


def test_examples_come_from_a_stream_fixed_per_task() -> None:
    def make(rng: random.Random, tokenizer: object) -> ProbeExample:
        return [rng.randrange(100)], {"x": 0}

    first = probe_examples(make, None, "tool_lookup", n=5)
    assert first == probe_examples(make, None, "tool_lookup", n=5)  # whatever the seed of the run
    assert first != probe_examples(make, None, "another", n=5)
