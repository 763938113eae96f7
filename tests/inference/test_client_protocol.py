"""The SGLang wire format the client and the CPU server share (``rollflow.inference.sglang_protocol``); no server."""

from __future__ import annotations

import pytest

from rollflow.api.errors import InvalidRequestError
from rollflow.inference.client import EngineClient
from rollflow.inference.sglang_protocol import (
    TOP_K_ALL,
    UpdateWeightFromDiskReqInput,
    WeightVersionSpan,
    build_generate_payload,
    compute_weight_version_spans,
    parse_generate_request,
    parse_generate_response,
    token_versions_from_meta,
)


def test_sampling_params_are_normalised_like_sglang() -> None:
    (item,), is_batch = parse_generate_request({"input_ids": [1, 2], "sampling_params": {"temperature": 0}})
    sp = item.sampling
    assert not is_batch and (sp.temperature, sp.top_k, sp.is_greedy) == (1.0, 1, True)  # T < 1e-6: greedy
    assert sp.max_new_tokens == 128 and sp.top_p == 1.0 and sp.skip_special_tokens  # SGLang defaults
    (item,), _ = parse_generate_request(
        {"input_ids": [1], "sampling_params": {"top_k": -1, "temperature": None}}
    )
    assert item.sampling.top_k == TOP_K_ALL and item.sampling.temperature == 1.0  # null means default
    items, is_batch = parse_generate_request({"input_ids": [[1], [2, 3]], "rid": "g"})
    assert is_batch and [i.rid for i in items] == ["g_0", "g_1"]
    with pytest.raises(InvalidRequestError, match="rids length mismatch"):
        parse_generate_request({"input_ids": [[1], [2]], "rid": ["only-one"]})


def test_weight_version_spans_worked_examples() -> None:
    # One update after 5 tokens, 8 tokens in all: [("3", 0, 5), ("4", 5, 8)].
    assert compute_weight_version_spans([("3", 5)], "4", 8) == [
        WeightVersionSpan("3", 0, 5),
        WeightVersionSpan("4", 5, 8),
    ]
    # An update to the same version merges; an event at 0 tokens leaves no empty span.
    assert compute_weight_version_spans([("4", 0), ("4", 3)], "4", 6) == [WeightVersionSpan("4", 0, 6)]
    assert compute_weight_version_spans([], "7", 0) == [WeightVersionSpan("7", 0, 0)]
    meta = {
        "weight_version": "4",
        "weight_versions": [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}],
    }
    assert token_versions_from_meta(meta, 3) == ["3", "3", "4"]
    assert token_versions_from_meta({"weight_version": "9"}, 2) == ["9", "9"]  # no spans: one version


def test_client_payload_and_reply_parsing() -> None:
    body = build_generate_payload(
        [1, 2], max_new_tokens=5, temperature=0.5, stop_token_ids=[3], sampling_seed=7, rid="r-0"
    )
    assert body == {
        "input_ids": [1, 2],
        "sampling_params": {
            "max_new_tokens": 5, "temperature": 0.5, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": False,
            "skip_special_tokens": True, "stop_token_ids": [3], "sampling_seed": 7,
        },
        "return_logprob": True,
        "rid": "r-0",
    }  # fmt: skip
    reply = {
        "text": "ab",
        "output_ids": [4, 5],
        "meta_info": {"id": "r-0", "finish_reason": {"type": "abort", "message": "Aborted"}, "weight_version": "2",
                      "output_token_logprobs": [[-0.5, 4, None], [-1.5, 5, None]], "prompt_tokens": 2},
    }  # fmt: skip
    out = parse_generate_response(reply)
    assert (
        out.finish_type == "abort"
        and out.output_token_logprobs == [-0.5, -1.5]
        and out.token_versions == ["2", "2"]
    )
    reply["meta_info"]["output_token_logprobs"] = [[-0.5, 4, None]]
    with pytest.raises(InvalidRequestError, match="2 output_ids but 1 output_token_logprobs"):
        parse_generate_response(reply)


def test_update_request_round_trip_and_version_strings() -> None:
    req = UpdateWeightFromDiskReqInput.from_json({"model_path": "/c/v000003", "weight_version": "3"})
    assert req.to_json() == {
        "model_path": "/c/v000003",
        "abort_all_requests": False,
        "weight_version": "3",
        "flush_cache": True,
    }  # fmt: skip (flush_cache always explicit: its right value depends on the pause mode)
    assert req.flush_cache and not req.abort_all_requests and req.load_format is None


def test_client_versions_parse_to_int_with_fallback() -> None:
    client = EngineClient(["127.0.0.1:1"], initial_version=2)
    assert client._parse_version("default") == 2  # SGLang's default name: the client's current version
    assert client._parse_version("5") == 5 and client.get_version() == 5  # seen in a reply: raised
    client.set_version(3)
    assert client.get_version() == 5  # never lowered
