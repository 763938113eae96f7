"""SGLang for real: rollflow's client, engine, watcher and supervisor against SGLang 0.5.23's own server.

One session server (tests/inference/conftest.py: ``.venv-sglang``, CPU, 30-40 s to start) serves all of
these, in order:

- the launch flags the launcher chose from the config (device cpu, torch_native attention, float32, a
  bounded KV pool) and what the server says it runs;
- batched ``/generate`` on token ids with logprobs, through the engine's own batched call and through the
  client: every behaviour logprob equals the trainer's recomputation (``forward_logprobs``);
- a weight load in each pause mode with 64 requests in flight, through ``CheckpointWatcher``: none lost,
  every token carries the version that made it (a teacher-forced pass agrees with its logprob), the
  server alive and reporting the new version; after ``abort`` / ``retract`` a prompt cached under the old
  weights is recomputed (the cache was flushed), after ``in_place`` it may be reused (the documented cost);
- an ``in_place`` pause that rollflow's engine did not make, so the update asks for a flush: SGLang's
  400 "Weights were updated, but the cache was not flushed" is recognised and the reported version is
  brought in line with the weights that are live;
- a checkpoint that does not load: ``WeightUpdateError``, the old weights still served;
- ``/abort_request`` (an exact rid; a mere prefix is ignored), ``/flush_cache`` (refused while busy, done
  when idle);
- last, kill -9 of the server in the middle of generation: the supervisor restarts it, the client's
  requests wait and resume, the watcher loads the served version into it again; nothing is lost.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from server_waits import until_sglang_streams
from teacher_forcing import kept_cache_logprobs as _kept_cache_logprobs
from teacher_forcing import load_model as _model
from teacher_forcing import trainer_logprobs as _trainer_logprobs

from rollflow.api.errors import WeightUpdateError
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.inference.routing import control_call
from rollflow.inference.sglang import SGLangEngine
from rollflow.inference.watcher import CheckpointWatcher
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

pytestmark = pytest.mark.slow  # the session's SGLang server takes 30-40 s to start, the restart as long

PROMPTS = [[2, 4 + (i % 40), 5 + (i * 7) % 40, 6 + (i * 3) % 40] for i in range(64)]
CACHED_PROMPT = [2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # prefilled under the old weights only
N_NEW = 200
TOL = 1e-3  # |logprob difference|, fp32 on both sides


def _client(group: Any, key: str) -> EngineClient:
    return EngineClient(group.addresses, engine=SGLangEngine(), api_key=key, retry_backoff_s=0.2)


def _store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"))


def _raw_generate(addr: str, key: str, ids: list[int], n: int) -> dict[str, Any]:
    body = {
        "input_ids": ids, "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
    }  # fmt: skip
    return control_call(addr, "/generate", body, api_key=key, timeout_s=60)


def _while_generating(
    group: Any, key: str, prompts: list[list[int]], action: Callable[[], None], n_new: int = N_NEW
) -> list[GenerateResult]:
    """Send ``prompts`` (temperature 1, ``n_new`` tokens each), run ``action`` in a thread once the scheduler is
    decoding them, and return every result."""

    async def go() -> list[GenerateResult]:
        client = _client(group, key)
        try:
            sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, ignore_eos=True)
            tasks = [asyncio.create_task(client.agenerate(GenerateRequest(p, sp))) for p in prompts]
            await asyncio.sleep(0.3)  # the requests are sent first
            stream = await until_sglang_streams(group.addresses[0], key, chunks=20)
            try:
                await asyncio.to_thread(action)
            finally:
                await stream.aclose()
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_launch_flags_come_from_the_config(sglang_server: Any) -> None:
    cmd = sglang_server.servers[0].command
    joined = " ".join(cmd)
    for flag in ("--device cpu", "--attention-backend torch_native", "--disable-cuda-graph", "--dtype float32",
                 "--max-total-tokens 65536", "--mem-fraction-static 0.2", "--weight-version 0"):  # fmt: skip
        assert flag in joined, (flag, cmd)
    assert "--base-gpu-id" not in cmd
    info = control_call(sglang_server.addresses[0], "/server_info", api_key="test-sglang-key")
    assert (
        info["device"] == "cpu"
        and info["attention_backend"] == "torch_native"
        and info["version"] == "0.5.23"
    )
    assert info["dtype"] == "float32"


def test_batched_generate_logprobs_match_the_trainer(
    sglang_server: Any, vllm_models: Any, sglang_lib: Any
) -> None:
    addr, eng = sglang_server.addresses[0], SGLangEngine()
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)
    call = eng.generate_call([f"batch-{i}" for i in range(8)], PROMPTS[:8], sp, 24)  # one request, 8 prompts
    body = control_call(addr, call.route, call.payload, api_key=sglang_lib.KEY, timeout_s=60)
    batched = eng.parse_generate(body, 8)

    async def go() -> list[GenerateResult]:
        client = _client(sglang_server, sglang_lib.KEY)
        try:
            groups = [[GenerateRequest(p, sp) for _ in range(4)] for p in PROMPTS[8:24]]  # 16 prompts x 4
            return [r for g in await asyncio.gather(*(client.agenerate_many(g) for g in groups)) for r in g]
        finally:
            await client.aclose()

    results = asyncio.run(go())
    model = _model(vllm_models.a)
    deviations = []
    pairs = [(p, o.output_ids, o.output_token_logprobs) for p, o in zip(PROMPTS[:8], batched, strict=True)]
    pairs += [(r.input_ids, r.output_ids, r.output_logprobs) for r in results]
    for prompt, out, logps in pairs:
        assert len(out) == 24 == len(logps)
        prox = _trainer_logprobs(model, prompt + out, len(prompt))
        deviations += [abs(math.exp(p - b) - 1.0) for p, b in zip(prox, logps, strict=True)]
    assert all(set(r.output_versions) == {0} for r in results)
    deviations.sort()
    worst, p99 = deviations[-1], deviations[int(0.99 * (len(deviations) - 1))]
    print(f"sglang logprob parity over {len(deviations)} tokens: max |ratio - 1| {worst:.2e}, p99 {p99:.2e}")
    assert worst < TOL


@pytest.mark.parametrize("pause_mode", ["retract", "abort", "in_place"])
def test_update_with_64_requests_in_flight(
    request: pytest.FixtureRequest, vllm_models: Any, sglang_lib: Any, tmp_path: Path, pause_mode: str
) -> None:
    """retract (the default) and abort on the session server (SGLang's overlap scheduler on, as on GPUs);
    in_place on a server launched for it (the launcher then turns the overlap scheduler off)."""
    name = "sglang_server_in_place" if pause_mode == "in_place" else "sglang_server"
    sglang_server = request.getfixturevalue(name)
    assert ("--disable-overlap-schedule" in sglang_server.servers[0].command) == (pause_mode == "in_place")
    addr, key = sglang_server.addresses[0], sglang_lib.KEY
    store = _store(tmp_path)
    store.publish(vllm_models.a, 0)
    watcher = CheckpointWatcher(
        store, sglang_server.addresses, cache_dir=tmp_path / "cache", engine=SGLangEngine(), api_key=key,
        pause_mode=pause_mode,  # type: ignore[arg-type]
    )  # fmt: skip
    assert watcher.poll_once() == 0  # already served: an ack, no load
    cached_before = _raw_generate(addr, key, CACHED_PROMPT, 4)  # its prefix now sits in the radix cache
    store.publish(vllm_models.b, 1)

    def load() -> None:
        assert watcher.poll_once() == 1

    try:
        results = _while_generating(sglang_server, key, PROMPTS, load)
        assert SGLangEngine().served_version(addr, api_key=key, timeout_s=10) == "1"
        assert SGLangEngine().health(addr, timeout_s=10)
        cached_after = _raw_generate(addr, key, CACHED_PROMPT, 4)
    finally:
        sglang_lib.serve(sglang_server, vllm_models.a, "0")
    old, new = _model(vllm_models.a), _model(vllm_models.b)
    assert len(results) == 64
    mixed = 0
    for r in results:
        assert len(r.output_ids) == N_NEW == len(r.output_versions) == len(r.output_logprobs)
        assert r.output_versions == sorted(r.output_versions) and set(r.output_versions) <= {0, 1}
        k = r.output_versions.count(0)
        mixed += 0 < k < N_NEW
        ids, n = r.input_ids + r.output_ids, len(r.input_ids)
        before = _trainer_logprobs(old, ids, n)[:k]
        after = {"recomputed": _trainer_logprobs(new, ids, n)[k:]}
        if pause_mode == "in_place" and k > 0:  # the KV cache of prompt + k - 1 outputs is the old model's
            after["old KV cache"] = _kept_cache_logprobs(old, new, ids, n + k - 1)
        worst = {
            how: max(abs(w - g) for w, g in zip(before + want, r.output_logprobs, strict=True))
            for how, want in after.items()
        }
        assert min(worst.values()) < TOL, f"{pause_mode}: k={k}, worst logprob differences {worst}"
    assert mixed > 0, "no request spanned the update (it came too late or too early)"

    # The prompt prefilled under the old weights only, asked again after the update:
    ids_after = CACHED_PROMPT + cached_after["output_ids"]
    got = [lp for lp, _t, _x in cached_after["meta_info"]["output_token_logprobs"]]
    fresh = _trainer_logprobs(new, ids_after, len(CACHED_PROMPT))
    d_fresh = max(abs(a - b) for a, b in zip(fresh, got, strict=True))
    n_cached = cached_after["meta_info"]["cached_tokens"]
    print(f"{pause_mode}: prompt cached before the update, asked after it: |d| from the new model {d_fresh:.2e}, "
          f"cached_tokens {n_cached}")  # fmt: skip
    assert (
        cached_before["meta_info"]["weight_version"] == "0"
        and cached_after["meta_info"]["weight_version"] == "1"
    )
    if pause_mode in ("abort", "retract"):
        assert d_fresh < TOL, "a prefix cached under the old weights was reused after a flushed update"
    else:  # in_place cannot flush (its kept requests run): the old weights' prefix is reused, as documented
        assert n_cached > 0 and d_fresh > TOL


def test_in_place_update_the_engine_did_not_pause_keeps_the_record_right(
    sglang_server: Any, vllm_models: Any, sglang_lib: Any
) -> None:
    """Someone else paused in_place; the update then asks for a flush, which SGLang refuses with a 400 while
    swapping the weights anyway. The engine sees that, aligns /model_info, and does not raise."""
    addr, key = sglang_server.addresses[0], sglang_lib.KEY
    eng = SGLangEngine()

    def load_under_a_foreign_pause() -> None:
        control_call(addr, "/pause_generation", {"mode": "in_place"}, api_key=key)  # not the engine's
        try:
            eng.load_weights(addr, vllm_models.b, "5", api_key=key, timeout_s=120)
            assert eng.served_version(addr, api_key=key, timeout_s=10) == "5"
        finally:
            control_call(addr, "/continue_generation", {}, api_key=key)

    try:
        results = _while_generating(sglang_server, key, PROMPTS[:16], load_under_a_foreign_pause)
    finally:
        sglang_lib.serve(sglang_server, vllm_models.a, "0")
    assert all(len(r.output_ids) == N_NEW for r in results)
    assert any(5 in r.output_versions for r in results)  # the scheduler tagged the new weights' tokens


def test_a_checkpoint_that_does_not_load_keeps_the_old_weights(
    sglang_server: Any, vllm_models: Any, sglang_lib: Any, tmp_path: Path
) -> None:
    """SGLang 0.5.23 copies tensor by tensor into the live model; a tensor of another shape crashes its
    scheduler and the whole server (seen here). The engine checks the headers first and refuses."""
    addr, key, eng = sglang_server.addresses[0], sglang_lib.KEY, SGLangEngine()
    before = _raw_generate(addr, key, PROMPTS[0], 12)["output_ids"]
    truncated = tmp_path / "truncated"
    shutil.copytree(vllm_models.b, truncated)
    weights = truncated / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    for bad, why in [(vllm_models.wide, "shape"), (truncated, "truncated or damaged")]:
        eng.pause(addr, "retract", api_key=key, timeout_s=30)
        try:
            with pytest.raises(WeightUpdateError, match=why):
                eng.load_weights(addr, bad, "9", api_key=key, timeout_s=120)
        finally:
            eng.resume(addr, api_key=key, timeout_s=30)
        assert eng.served_version(addr, api_key=key, timeout_s=10) == "0"
        assert _raw_generate(addr, key, PROMPTS[0], 12)["output_ids"] == before  # the old weights, whole


def test_abort_request_and_flush_cache(sglang_server: Any, sglang_lib: Any) -> None:
    addr, key, eng = sglang_server.addresses[0], sglang_lib.KEY, SGLangEngine()

    async def go() -> tuple[list[GenerateResult], int]:
        client = _client(sglang_server, key)
        try:
            sp = SamplingParams(max_new_tokens=800, temperature=1.0, ignore_eos=True)
            call = eng.generate_call(["victim-0"], [PROMPTS[1]], sp, 800)
            victim = asyncio.create_task(
                asyncio.to_thread(control_call, addr, call.route, call.payload, api_key=key, timeout_s=60)
            )
            stream = await until_sglang_streams(addr, key, chunks=5)
            busy = await asyncio.to_thread(
                lambda: _status(addr, "/flush_cache", key)
            )  # refused: requests are running
            ab = eng.abort_call(["victim"])  # only a prefix of the rid: SGLang ignores it
            await asyncio.to_thread(control_call, addr, ab.route, ab.payload, api_key=key)
            ab = eng.abort_call(["victim-0"])  # the exact rid, as the client sends it
            await asyncio.to_thread(control_call, addr, ab.route, ab.payload, api_key=key)
            body = await victim
            await stream.aclose()
            return [eng.parse_generate(body, 1)[0]], busy
        finally:
            await client.aclose()

    (out,), busy = asyncio.run(go())
    assert out.finish_type == "abort" and 0 < len(out.output_ids) < 800
    assert busy == 400
    deadline = time.monotonic() + 30
    while _status(addr, "/flush_cache", key) != 200:  # idle once the stream's request is gone
        assert time.monotonic() < deadline, "flush_cache never succeeded on an idle server"
        time.sleep(0.5)


def _status(addr: str, route: str, key: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://{addr}{route}", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_kill_9_mid_run_restarts_and_loses_nothing(
    sglang_server: Any, vllm_models: Any, sglang_lib: Any, tmp_path: Path
) -> None:
    from rollflow.inference.fleet_link import FleetLink

    addr, key = sglang_server.addresses[0], sglang_lib.KEY
    store = _store(tmp_path)
    store.publish(vllm_models.a, 0)
    store.publish(vllm_models.b, 1)
    client = _client(sglang_server, key)
    watcher = CheckpointWatcher(
        store, sglang_server.addresses, cache_dir=tmp_path / "cache", engine=SGLangEngine(), api_key=key,
        pause_mode="retract", on_update=client.set_version, poll_interval_s=0.5,
    )  # fmt: skip
    assert watcher.poll_once() == 1  # serving b as v1
    supervisor = sglang_server.supervise(
        max_restarts=1, interval_s=0.2, startup_timeout_s=sglang_lib.config().sglang.startup_timeout_s
    )
    link = FleetLink(client, watcher)
    supervisor.add_listener(link)
    watcher.start()
    n_new = 600

    async def go() -> list[GenerateResult]:
        try:
            sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, ignore_eos=True)
            tasks = [asyncio.create_task(client.agenerate(GenerateRequest(p, sp))) for p in PROMPTS[:4]]
            await asyncio.sleep(0.3)
            stream = await until_sglang_streams(addr, key, chunks=10)
            os.kill(sglang_server.servers[0].process.pid, signal.SIGKILL)  # as the OOM killer would
            await stream.aclose()
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    try:
        results = asyncio.run(go())
        deadline = time.monotonic() + 120
        while _version(addr, key) != "1" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _version(addr, key) == "1"  # the watcher caught the restarted server up
    finally:
        watcher.stop()
        supervisor.remove_listener(link)
    assert supervisor.restarts[addr] == 1 and not supervisor.lost
    models = {0: _model(vllm_models.a), 1: _model(vllm_models.b)}
    for r in results:  # every request has all its tokens, each exact for the version that made it
        assert len(r.output_ids) == n_new and r.finish_reason == "length" and r.n_interruptions >= 1
        ids, n = r.input_ids + r.output_ids, len(r.input_ids)
        tf = {v: _trainer_logprobs(m, ids, n) for v, m in models.items()}
        for i, (v, lp) in enumerate(zip(r.output_versions, r.output_logprobs, strict=True)):
            assert abs(tf[v][i] - lp) < TOL, (i, v)
    sglang_lib.serve(sglang_server, vllm_models.a, "0")


def _version(addr: str, key: str) -> str | None:
    try:
        return SGLangEngine().served_version(addr, api_key=key, timeout_s=5)
    except Exception:  # restarting
        return None
