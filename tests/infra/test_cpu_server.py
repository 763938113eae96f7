"""The CPU server against SGLang's protocol, over real HTTP on 127.0.0.1 (one shared session server).

Checks: reply shape; 32 concurrent requests decoded in one batch; per-token logprobs equal a
teacher-forced forward (1e-4, T = 1, and the temperature-scaled distribution at T = 0.7); greedy, seeded
and top-k / top-p / min-p sampling semantics; stop tokens; abort by rid prefix; pause modes; failed weight
updates that keep the old weights; every bad request answered with a 4xx that says what is wrong.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

PROMPT = [5, 6, 7, 8]


def call(addr: str, path: str, body: Any = None, *, raw: bytes | None = None, method: str | None = None,
         headers: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, Any]:  # fmt: skip
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        f"http://{addr}{path}",
        data=data,
        method=method or ("GET" if data is None else "POST"),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    try:
        return status, json.loads(payload) if payload else None
    except json.JSONDecodeError:
        return status, payload.decode()


def generate(addr: str, ids: list[int], **sp: Any) -> dict[str, Any]:
    extra = {k: sp.pop(k) for k in ("rid",) if k in sp}
    status, out = call(
        addr, "/generate", {"input_ids": ids, "sampling_params": sp, "return_logprob": True, **extra}
    )
    assert status == 200, out
    return out


def stats(addr: str) -> dict[str, Any]:
    return call(addr, "/get_server_info")[1]["internal_states"][0]


def wait_running(addr: str, n: int = 1, min_tokens: int = 1, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = stats(addr)
        if st["num_running_reqs"] >= n and st["running_output_tokens"] >= min_tokens:
            return
        time.sleep(0.01)
    raise AssertionError(f"requests never started running: {stats(addr)}")


@pytest.fixture()
def addr(cpu_server: Any) -> str:
    return cpu_server.addresses[0]


def test_generate_reply_has_sglang_shape(addr: str) -> None:
    out = generate(addr, PROMPT, max_new_tokens=6, ignore_eos=True, rid="shape-1")
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 6 and isinstance(out["text"], str)
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 6
    assert meta["weight_version"] == "0"
    assert meta["weight_versions"] == [{"version": "0", "start": 0, "end": 6}]
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"] and all(t[0] <= 0 and t[2] is None for t in triples)

    # A batch of input_ids: a list of replies, a string rid becomes the prefix rid_i (SGLang).
    status, batch = call(
        addr,
        "/generate",
        {"input_ids": [PROMPT, [9, 10]], "rid": "b", "sampling_params": {"max_new_tokens": 2}},
    )
    assert status == 200 and [r["meta_info"]["id"] for r in batch] == ["b_0", "b_1"]
    # text in, when the model dir has a tokenizer; max_new_tokens 0 returns at once.
    status, t = call(addr, "/generate", {"text": "1+2=", "sampling_params": {"max_new_tokens": 0}})
    assert (
        status == 200
        and t["output_ids"] == []
        and t["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    )


def test_32_concurrent_requests_are_decoded_together(addr: str) -> None:
    before = stats(addr)
    with ThreadPoolExecutor(32) as pool:
        outs = list(
            pool.map(
                lambda i: generate(addr, [5 + i % 7, 6, 7], max_new_tokens=24, ignore_eos=True), range(32)
            )
        )
    after = stats(addr)
    assert all(len(o["output_ids"]) == 24 for o in outs)
    steps = after["decode_steps"] - before["decode_steps"]
    seqs = after["decode_seqs_total"] - before["decode_seqs_total"]
    # One at a time would be 32 * 23 = 736 decode steps of 1 sequence; batched, ~23 steps of ~32.
    assert seqs == 32 * 23
    assert seqs / steps > 8, f"mean decode batch {seqs / steps:.1f}"
    assert after["max_decode_batch"] >= 16


def test_logprobs_equal_teacher_forced_forward(addr: str, tiny_model_dir: Path, inference_lib: Any) -> None:
    # Prompts of different lengths in flight together: exercises padding, masks and slot compaction.
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15], [20], [30, 31, 32, 33, 34]]
    with ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(lambda p: generate(addr, p, max_new_tokens=20 + len(p), ignore_eos=True), prompts)
        )
    for p, o in zip(prompts, outs, strict=True):
        ref = inference_lib.teacher_forced_logprobs(tiny_model_dir, p + o["output_ids"], len(p))
        got = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4

    # T = 0.7: logprobs of the temperature-scaled distribution log softmax(logits / 0.7) (SGLang's default).
    o = generate(addr, PROMPT, max_new_tokens=12, temperature=0.7, ignore_eos=True)
    ref = inference_lib.teacher_forced_logprobs(tiny_model_dir, PROMPT + o["output_ids"], 4, temperature=0.7)
    got = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4

    # T = 0: greedy tokens, logprobs of the raw distribution.
    o = generate(addr, PROMPT, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    ids = PROMPT + o["output_ids"]
    logits = inference_lib.teacher_forced_logits(tiny_model_dir, ids)
    assert o["output_ids"] == [int(logits[t - 1].argmax()) for t in range(4, len(ids))]
    ref = inference_lib.teacher_forced_logprobs(tiny_model_dir, ids, 4)
    assert (
        max(abs(t[0] - r) for t, r in zip(o["meta_info"]["output_token_logprobs"], ref, strict=True)) < 1e-4
    )


def test_seeded_sampling_is_deterministic(addr: str) -> None:
    def run(seed: int) -> list[int]:
        return generate(addr, PROMPT, max_new_tokens=24, ignore_eos=True, sampling_seed=seed)["output_ids"]

    with ThreadPoolExecutor(6) as pool:  # same seed, different batch company: same tokens
        a, b, c, d, *_ = pool.map(run, [7, 7, 8, 7, 1, 2])
    assert a == b == d
    assert a != c
    # top_k = 1 is greedy, whatever the temperature (SGLang).
    g = generate(addr, PROMPT, max_new_tokens=16, temperature=0.0, ignore_eos=True)["output_ids"]
    assert (
        generate(addr, PROMPT, max_new_tokens=16, temperature=1.3, top_k=1, ignore_eos=True)["output_ids"]
        == g
    )


@pytest.mark.parametrize(
    "params",
    [{"top_k": 3}, {"top_p": 0.5}, {"min_p": 0.3}, {"top_k": 5, "top_p": 0.8, "temperature": 0.8}],
    ids=["top_k", "top_p", "min_p", "combined"],
)
def test_sampling_filters_follow_sglang(
    addr: str, tiny_model_dir: Path, inference_lib: Any, params: dict[str, Any]
) -> None:
    T = params.get("temperature", 1.0)
    with ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(
                lambda s: generate(
                    addr, PROMPT, max_new_tokens=16, ignore_eos=True, sampling_seed=s, **params
                ),
                range(4),
            )
        )
    for o in outs:
        ids = PROMPT + o["output_ids"]
        probs = torch.softmax(inference_lib.teacher_forced_logits(tiny_model_dir, ids) / T, dim=-1)
        for t in range(4, len(ids)):
            p_sorted, order = probs[t - 1].sort(descending=True)
            keep = torch.ones_like(p_sorted, dtype=torch.bool)
            keep &= torch.arange(len(p_sorted)) < params.get("top_k", 1 << 30)
            keep &= (p_sorted.cumsum(0) - p_sorted) <= params.get("top_p", 1.0) + 1e-6  # mass before <= top_p
            keep &= p_sorted >= p_sorted[0] * params.get("min_p", 0.0) - 1e-7
            assert ids[t] in set(order[keep].tolist()), f"token {ids[t]} at {t} is outside the filtered set"


def test_stop_token_ids_end_generation_and_are_returned(addr: str) -> None:
    greedy = generate(addr, PROMPT, max_new_tokens=30, temperature=0.0, ignore_eos=True)["output_ids"]
    stop_at = next(i for i, t in enumerate(greedy) if t not in greedy[:i] and i >= 2)
    out = generate(
        addr, PROMPT, max_new_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[greedy[stop_at]]
    )
    assert out["output_ids"] == greedy[: stop_at + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": greedy[stop_at]}


def test_abort_request_needs_an_exact_rid_then_matches_its_prefix(addr: str) -> None:
    """SGLang 0.5.23 (seen on its real server): an rid that no request has exactly is ignored; an exact one
    aborts every request whose rid starts with it, each returning its partial output."""
    results: dict[str, Any] = {}

    def run(rid: str, n: int) -> None:
        results[rid] = generate(addr, PROMPT, max_new_tokens=n, ignore_eos=True, rid=rid)

    threads = [threading.Thread(target=run, args=a) for a in (("job7", 900), ("job7-b", 900), ("other", 60))]
    for t in threads:
        t.start()
    wait_running(addr, n=3, min_tokens=30)
    assert call(addr, "/abort_request", {"rid": "job"}) == (200, None)  # no request is "job": ignored
    wait_running(addr, n=3, min_tokens=40)  # all three still run
    assert call(addr, "/abort_request", {"rid": "job7"}) == (200, None)
    for t in threads:
        t.join(30)
    for rid in ("job7", "job7-b"):
        meta = results[rid]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["message"] == "Aborted"
        n = len(results[rid]["output_ids"])
        assert 0 < n < 900 and meta["completion_tokens"] == n == len(meta["output_token_logprobs"])
    assert results["other"]["meta_info"]["finish_reason"] == {"type": "length", "length": 60}
    # An empty rid without abort_all is ignored (SGLang).
    assert call(addr, "/abort_request", {})[0] == 200


def test_pause_abort_returns_partials_and_new_requests_wait(addr: str) -> None:
    first: dict[str, Any] = {}
    t1 = threading.Thread(
        target=lambda: first.update(generate(addr, PROMPT, max_new_tokens=900, ignore_eos=True))
    )
    t1.start()
    wait_running(addr, min_tokens=20)
    assert call(addr, "/pause_generation", {"mode": "abort"}) == (
        200,
        {"message": "Generation paused successfully.", "status": "ok"},
    )
    t1.join(10)
    assert first["meta_info"]["finish_reason"]["type"] == "abort" and 0 < len(first["output_ids"]) < 900
    second: dict[str, Any] = {}
    t2 = threading.Thread(
        target=lambda: second.update(generate(addr, PROMPT, max_new_tokens=5, ignore_eos=True))
    )
    t2.start()
    time.sleep(0.5)
    assert t2.is_alive() and not second, "a /generate while paused must wait, not fail"
    assert call(addr, "/continue_generation", {})[0] == 200
    t2.join(10)
    assert second["meta_info"]["finish_reason"]["type"] == "length"


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_retract_and_in_place_keep_requests(addr: str, mode: str) -> None:
    out: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: out.update(
            generate(addr, PROMPT, max_new_tokens=300, temperature=0.0, ignore_eos=True)
        )
    )
    t.start()
    wait_running(addr, min_tokens=10)
    assert call(addr, "/pause_generation", {"mode": mode})[0] == 200
    time.sleep(0.2)
    assert t.is_alive()
    assert call(addr, "/continue_generation", {})[0] == 200
    t.join(30)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
    assert out["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)
    # Retracted requests recompute their KV from prompt + output: same greedy tokens as an uninterrupted run.
    assert (
        out["output_ids"]
        == generate(addr, PROMPT, max_new_tokens=300, temperature=0.0, ignore_eos=True)["output_ids"]
    )


def _bad_checkpoints(tmp: Path, good: Path, inference_lib: Any) -> dict[str, tuple[Path, str]]:
    import shutil

    from safetensors.torch import load_file, save_file

    out: dict[str, tuple[Path, str]] = {"missing dir": (tmp / "nope", "is not a directory")}
    trunc = tmp / "truncated"
    shutil.copytree(good, trunc)
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    out["truncated safetensors"] = (trunc, "cannot read model.safetensors")
    out["other architecture"] = (
        inference_lib.write_tiny_model(tmp / "wide", seed=3, hidden_size=128),
        "does not match the served model: hidden_size",
    )
    nan = tmp / "nan"
    shutil.copytree(good, nan)
    tensors = load_file(nan / "model.safetensors")
    tensors["lm_head.weight"][0, 0] = float("nan")
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    out["nan weights"] = (nan, "NaN or inf")
    missing = tmp / "missing-tensor"
    shutil.copytree(good, missing)
    tensors.pop("lm_head.weight")
    save_file(tensors, missing / "model.safetensors", metadata={"format": "pt"})
    out["missing tensor"] = (missing, "no tensor 'lm_head.weight'")
    return out


def test_failed_weight_updates_keep_old_weights_serving(
    addr: str, tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any, tmp_path: Path
) -> None:
    before = generate(addr, PROMPT, max_new_tokens=20, temperature=0.0, ignore_eos=True)["output_ids"]
    for name, (path, fragment) in _bad_checkpoints(tmp_path, tiny_model_dir_b, inference_lib).items():
        status, body = call(
            addr, "/update_weights_from_disk", {"model_path": str(path), "weight_version": "9"}
        )
        assert status == 400 and body["success"] is False, name
        assert (
            body["message"].startswith("Failed to get weights iterator:") and fragment in body["message"]
        ), body
        assert (
            generate(addr, PROMPT, max_new_tokens=20, temperature=0.0, ignore_eos=True)["output_ids"]
            == before
        )
        assert call(addr, "/get_model_info")[1]["weight_version"] == "0"


def test_successful_update_swaps_weights_and_bumps_version(
    addr: str, tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any
) -> None:
    try:
        status, body = call(
            addr, "/update_weights_from_disk", {"model_path": str(tiny_model_dir_b), "weight_version": "1"}
        )
        assert (status, body) == (
            200,
            {
                "success": True,
                "message": "Succeeded to update model weights. Weight version updated to 1.",
                "num_paused_requests": 0,
            },
        )
        o = generate(addr, PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
        assert o["meta_info"]["weight_version"] == "1"
        ref = inference_lib.teacher_forced_logprobs(tiny_model_dir_b, PROMPT + o["output_ids"], 4)
        assert (
            max(abs(t[0] - r) for t, r in zip(o["meta_info"]["output_token_logprobs"], ref, strict=True))
            < 1e-4
        )
    finally:  # the session server must go back to tiny_model_dir / "0"
        assert (
            call(
                addr, "/update_weights_from_disk", {"model_path": str(tiny_model_dir), "weight_version": "0"}
            )[0]
            == 200
        )


@pytest.mark.parametrize("flush", [False, True])
def test_update_during_in_place_pause_records_weight_version_spans(
    addr: str, tiny_model_dir: Path, tiny_model_dir_b: Path, flush: bool
) -> None:
    """SGLang 0.5.23's rule, measured on its real server: after an ``in_place`` pause, an update that asks
    to flush the cache (the default) is refused with 400 because requests still run, yet the weights ARE
    swapped and new tokens carry the new version, while /model_info keeps the old one. With
    ``flush_cache: false`` (what rollflow's SGLang engine sends after an in_place pause) it is a 200."""
    out: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: out.update(generate(addr, PROMPT, max_new_tokens=400, ignore_eos=True))
    )
    t.start()
    wait_running(addr, min_tokens=10)
    try:
        assert call(addr, "/pause_generation", {"mode": "in_place"})[0] == 200
        body_in = {"model_path": str(tiny_model_dir_b), "weight_version": "1", "flush_cache": flush}
        status, body = call(addr, "/update_weights_from_disk", body_in)
        if flush:
            assert status == 400 and body["message"].startswith("Weights were updated, but the cache was not")
            assert call(addr, "/model_info")[1]["weight_version"] == "0"  # SGLang's tokenizer-side copy
        else:
            assert status == 200 and body["num_paused_requests"] == 1
            assert call(addr, "/model_info")[1]["weight_version"] == "1"
        assert call(addr, "/continue_generation", {})[0] == 200
        t.join(30)
    finally:
        call(addr, "/continue_generation", {})
        t.join(30)
        call(addr, "/update_weights_from_disk", {"model_path": str(tiny_model_dir), "weight_version": "0"})
    spans = out["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "1"]  # the swap happened either way
    assert (
        spans[0]["start"] == 0 and 0 < spans[0]["end"] == spans[1]["start"] < 400 and spans[1]["end"] == 400
    )
    assert out["meta_info"]["weight_version"] == "1"
    assert call(addr, "/model_info")[1]["weight_version"] == "0"  # restored


def test_update_weight_version_route(addr: str) -> None:
    """SGLang's ``/update_weight_version``: the reported version changes, the weights do not."""
    try:
        status, body = call(addr, "/update_weight_version", {"new_version": "7", "abort_all_requests": False})
        assert status == 200 and body == {
            "success": True,
            "message": "Weight version updated to 7",
            "new_version": "7",
        }
        assert call(addr, "/model_info")[1]["weight_version"] == "7"
        assert generate(addr, PROMPT, max_new_tokens=2)["meta_info"]["weight_version"] == "7"
        assert call(addr, "/update_weight_version", {"new_version": 7})[0] == 400
    finally:
        call(addr, "/update_weight_version", {"new_version": "0", "abort_all_requests": False})


BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    # (name, route, body (bytes = raw), status, fragment of the message)
    ("malformed json", "/generate", b"{not json", 400, "malformed JSON body"),
    ("body not an object", "/generate", [1, 2], 400, "must be a JSON object"),
    ("no prompt", "/generate", {"sampling_params": {}}, 400, "Either text, input_ids or input_embeds"),
    (
        "text and ids",
        "/generate",
        {"text": "1", "input_ids": [1]},
        400,
        "cannot be provided at the same time",
    ),
    ("empty input_ids", "/generate", {"input_ids": []}, 400, "input_ids must not be empty"),
    ("string token", "/generate", {"input_ids": [1, "a"]}, 400, "input_ids[1] must be an integer token id"),
    ("float token", "/generate", {"input_ids": [1.5]}, 400, "must be an integer token id"),
    ("bool token", "/generate", {"input_ids": [True]}, 400, "must be an integer token id"),
    (
        "token above vocab",
        "/generate",
        {"input_ids": [3, 10_000]},
        400,
        "input_ids[1] = 10000 is outside the vocabulary; valid range is [0, 48)",
    ),
    ("negative token", "/generate", {"input_ids": [-1]}, 400, "outside the vocabulary"),
    (
        "negative max_new_tokens",
        "/generate",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
        400,
        "max_new_tokens must be at least 0",
    ),
    (
        "huge max_new_tokens",
        "/generate",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": 10**9}},
        400,
        "exceeds the model's maximum context length of 1024",
    ),
    (
        "prompt too long",
        "/generate",
        {"input_ids": [1] * 1024},
        400,
        "longer than the model's context length",
    ),
    (
        "non-int max_new_tokens",
        "/generate",
        {"input_ids": [1], "sampling_params": {"max_new_tokens": "5"}},
        400,
        "max_new_tokens must be an integer",
    ),
    (
        "negative temperature",
        "/generate",
        {"input_ids": [1], "sampling_params": {"temperature": -1}},
        400,
        "temperature must be a non-negative",
    ),
    (
        "top_p zero",
        "/generate",
        {"input_ids": [1], "sampling_params": {"top_p": 0}},
        400,
        "top_p must be in (0, 1]",
    ),
    ("top_k zero", "/generate", {"input_ids": [1], "sampling_params": {"top_k": 0}}, 400, "top_k must be -1"),
    (
        "min_p above 1",
        "/generate",
        {"input_ids": [1], "sampling_params": {"min_p": 2}},
        400,
        "min_p must be in [0, 1]",
    ),
    (
        "unknown sampling key",
        "/generate",
        {"input_ids": [1], "sampling_params": {"max_tokens": 5}},
        400,
        "unknown key(s) ['max_tokens']",
    ),
    (
        "unsupported stop strings",
        "/generate",
        {"input_ids": [1], "sampling_params": {"stop": "\n"}},
        400,
        "not supported by rollflow's CPU server: stop",
    ),
    ("unsupported stream", "/generate", {"input_ids": [1], "stream": True}, 400, "stream"),
    (
        "bad seed",
        "/generate",
        {"input_ids": [1], "sampling_params": {"sampling_seed": 1.5}},
        400,
        "sampling_seed must be an integer",
    ),
    ("bad rid", "/generate", {"input_ids": [1], "rid": 5}, 400, "The rid should be a string"),
    ("update without model_path", "/update_weights_from_disk", {}, 400, "model_path is required"),
    (
        "update with int version",
        "/update_weights_from_disk",
        {"model_path": "/x", "weight_version": 3},
        400,
        "weight_version must be a string",
    ),
    ("bad pause mode", "/pause_generation", {"mode": "bogus"}, 400, "mode must be one of"),
    ("bad abort body", "/abort_request", {"rid": 5}, 400, "rid must be a string"),
    ("unknown route", "/generate_v2", {"input_ids": [1]}, 404, "Not Found"),
    # 100,000 nested brackets: json.loads raises RecursionError; a 500 would make the client retry.
    ("deeply nested JSON", "/generate", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
]


@pytest.mark.parametrize("name,route,body,status,fragment", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_4xx_with_a_clear_message(
    addr: str, name: str, route: str, body: Any, status: int, fragment: str
) -> None:
    got_status, reply = call(
        addr,
        route,
        raw=body if isinstance(body, bytes) else None,
        body=None if isinstance(body, bytes) else body,
    )
    assert got_status == status, reply
    assert fragment in reply["error"]["message"], reply


def test_server_keeps_serving_after_bad_requests_and_reports_info(addr: str) -> None:
    assert call(addr, "/generate", method="GET")[0] == 405
    assert len(generate(addr, PROMPT, max_new_tokens=3, ignore_eos=True)["output_ids"]) == 3
    assert call(addr, "/health")[0] == 200 and call(addr, "/health_generate")[0] == 200
    info = call(addr, "/get_model_info")[1]
    assert (
        info["weight_version"] == "0"
        and info["is_generation"]
        and info["architectures"] == ["LlamaForCausalLM"]
    )
    server = call(addr, "/get_server_info")[1]
    assert server["version"] == "0.5.23" and server["status"] == "ready" and server["api_key"] is None
    status, text = call(addr, "/flush_cache", method="POST")
    assert status == 200 and text.startswith("Cache flushed.")
