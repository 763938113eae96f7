"""SGLang sampling semantics of ``infra.cpu_server.sampling`` on hand-worked distributions (no server)."""

from __future__ import annotations

import math

import torch

from infra.cpu_server.sampling import RowSampling, sample_rows, seeded_uniform

ALL = 1 << 30


def row(
    u: float, *, t: float = 1.0, k: int = ALL, p: float = 1.0, min_p: float = 0.0, greedy: bool = False
) -> RowSampling:
    return RowSampling(temperature=t, top_k=k, top_p=p, min_p=min_p, greedy=greedy, uniform=u)


# p = softmax(log [0.5, 0.3, 0.2]) = [0.5, 0.3, 0.2]; cumulative [0.5, 0.8, 1.0].
LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))


def test_inverse_cdf_draws_and_logprobs_of_the_full_distribution() -> None:
    # u = 0.49 -> token 0 (cdf 0.5 > 0.49); u = 0.51 -> token 1 (0.5 <= 0.51 < 0.8); u = 0.85 -> token 2.
    toks, lps = sample_rows(LOGITS.repeat(3, 1), [row(0.49), row(0.51), row(0.85)])
    assert toks == [0, 1, 2]
    assert [round(x, 6) for x in lps] == [round(math.log(v), 6) for v in (0.5, 0.3, 0.2)]


def test_top_p_keeps_the_token_that_crosses_the_threshold() -> None:
    # top_p = 0.6: mass before each token [0, 0.5, 0.8]; 0.8 > 0.6 drops token 2.
    # Survivors [0.5, 0.3] renormalise to cdf [0.625, 1.0]: u = 0.7 -> token 1, u = 0.99 -> token 1.
    toks, lps = sample_rows(LOGITS.repeat(2, 1), [row(0.7, p=0.6), row(0.99, p=0.6)])
    assert toks == [1, 1]
    assert abs(lps[0] - math.log(0.3)) < 1e-6  # logprob of the UNfiltered distribution (SGLang)


def test_top_k_and_min_p() -> None:
    # top_k = 1: always token 0. min_p = 0.5: threshold 0.5 * 0.5 = 0.25 drops token 2 (0.2).
    toks, _ = sample_rows(LOGITS.repeat(2, 1), [row(0.99, k=1), row(0.99, min_p=0.5)])
    assert toks == [0, 1]


def test_temperature_scales_the_distribution_and_greedy_ignores_it() -> None:
    # T = 0.5 squares the probabilities before renormalising: [0.25, 0.09, 0.04] / 0.38.
    toks, lps = sample_rows(LOGITS.repeat(2, 1), [row(0.0, t=0.5), row(0.9, greedy=True)])
    assert toks == [0, 0]
    assert abs(lps[0] - math.log(0.25 / 0.38)) < 1e-6
    assert abs(lps[1] - math.log(0.5)) < 1e-6


def test_banned_tokens_are_masked() -> None:
    r = row(0.0)
    r.banned = (0,)
    toks, lps = sample_rows(LOGITS, [r])
    # Without token 0: [0.3, 0.2] / 0.5 -> u = 0 draws token 1 with logprob log 0.6.
    assert toks == [1] and abs(lps[0] - math.log(0.6)) < 1e-6


def test_seeded_uniform_is_pure_and_spread() -> None:
    assert seeded_uniform(42, 7) == seeded_uniform(42, 7)
    us = [seeded_uniform(42, i) for i in range(2000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert abs(sum(us) / len(us) - 0.5) < 0.03
    assert seeded_uniform(42, 7) != seeded_uniform(43, 7)
    assert 0.0 <= seeded_uniform(-(2**63), 0) < 1.0
