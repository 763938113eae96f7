"""One request's parameters never fail the other requests of the CPU server's batch (``engine.py``).

The engine is driven in-process (its own thread, a tiny model). Requests are submitted straight to the
engine, past the HTTP checks, to stand for anything the API boundary might miss: a stop id outside the
vocabulary while ``min_new_tokens`` bans it (the old engine aborted the whole batch with a 500), and a
NaN temperature (the old engine replied NaN logprobs). The bad row is aborted alone; the good rows of
the same batch finish with their full output and finite logprobs.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from infra.cpu_server.engine import Engine, EngineConfig, Sequence
from rollflow.inference.sglang_protocol import WireSamplingParams


def _run(model_dir: Path, sps: list[WireSamplingParams]) -> list[dict[str, Any]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = Engine(model, EngineConfig(context_len=256, batch_window_s=0.05))
    results: list[dict[str, Any]] = [{} for _ in sps]
    done = threading.Semaphore(0)

    def on_done(i: int, r: dict[str, Any]) -> None:
        results[i] = r
        done.release()

    engine.start()
    try:
        for i, sp in enumerate(sps):  # submitted together: admitted and sampled as one batch
            engine.submit(Sequence(f"r{i}", [5, 6, 7], sp, lambda r, i=i: on_done(i, r), return_logprob=True))
        for _ in sps:
            assert done.acquire(timeout=60)
    finally:
        engine.shutdown()
    return results


def _good() -> WireSamplingParams:
    return WireSamplingParams(max_new_tokens=5, ignore_eos=True)


def test_a_bad_row_is_aborted_alone_and_the_batch_goes_on(tiny_model_dir: Path) -> None:
    bad_stop = WireSamplingParams(max_new_tokens=5, min_new_tokens=3, stop_token_ids=[999_999, 2**70])
    nan_temp = WireSamplingParams(max_new_tokens=5, ignore_eos=True, temperature=float("nan"))
    out = _run(tiny_model_dir, [_good(), bad_stop, _good(), nan_temp, _good()])
    for i in (0, 2, 4):
        meta = out[i]["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": 5}, meta["finish_reason"]
        assert all(math.isfinite(lp) for lp, _, _ in meta["output_token_logprobs"])
    # ids outside the vocabulary can never be drawn, so banning them is a no-op: the row runs normally
    assert out[1]["meta_info"]["finish_reason"]["type"] == "length"
    nan = out[3]["meta_info"]
    assert nan["finish_reason"]["type"] == "abort" and nan["finish_reason"]["status_code"] == 500
    assert "non-finite logprob" in nan["finish_reason"]["message"]
    assert all(math.isfinite(lp) for lp, _, _ in nan.get("output_token_logprobs", []))
