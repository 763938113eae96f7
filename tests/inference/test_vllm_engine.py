"""vLLM for real: rollflow's client, watcher and supervisor against one vLLM server (CPU build, 127.0.0.1).

One session server (tests/inference/conftest.py, about a minute to start) serves all of these, in order:

- logprob parity: the behaviour logprobs vLLM returns equal the trainer's own recomputation
  (``rollflow.training.logprobs.forward_logprobs``, the proximal logprobs under ``max_staleness = 0``):
  ``exp(prox - behav)`` within 1e-3 of 1 on every token (max and p99 printed);
- an update in the middle of generation, in each pause mode, through ``CheckpointWatcher``: every token
  carries the version that produced it, and a teacher-forced pass agrees with its logprob (the old
  model before the update; after it the new model over the whole prefix for abort / retract; for
  in_place either that or the new model over the old model's KV cache, SGLang's in_place: vLLM 0.32's
  CPU build was seen to recompute);
- checkpoints that do not load (truncated safetensors, another architecture), directly and through the
  watcher: a clear ``WeightUpdateError`` / error event, the old weights still served, nothing half-loaded;
- last, kill -9 of the server in the middle of generation: its supervisor restarts it, the client's
  requests wait and resume, the watcher loads the served version into it again; every request ends
  with all its tokens, each with the right version and logprob.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from server_waits import until_vllm_streams
from teacher_forcing import kept_cache_logprobs as _kept_cache_logprobs
from teacher_forcing import load_model as _model
from teacher_forcing import trainer_logprobs as _trainer_logprobs

from rollflow.api.errors import WeightUpdateError
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.inference.client import EngineClient
from rollflow.inference.vllm import VLLMEngine
from rollflow.inference.watcher import CheckpointWatcher
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

pytestmark = pytest.mark.slow  # the session's vLLM server takes about a minute to start, the restart another

PROMPTS = [[2, 4 + (i % 40), 5 + (i * 7) % 40, 6 + (i * 3) % 40] for i in range(16)]
N_LONG = 1000  # new tokens of a request an update lands in the middle of (max_model_len is 1024)


def _client(group: Any) -> EngineClient:
    return EngineClient(group.addresses, engine=VLLMEngine(), api_key="test-vllm-key", retry_backoff_s=0.2)


def _greedy(group: Any, n: int = 12) -> list[int]:
    async def go() -> list[int]:
        client = _client(group)
        try:
            sp = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
            return (await client.agenerate(GenerateRequest(PROMPTS[0], sp))).output_ids
        finally:
            await client.aclose()

    return asyncio.run(go())


def _store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "trial"))


def _versions_ok(r: GenerateResult) -> None:
    assert len(r.output_versions) == len(r.output_ids) == len(r.output_logprobs)
    assert r.output_versions == sorted(r.output_versions), r.output_versions  # versions never go back


def test_logprob_parity_with_the_trainer(vllm_server: Any, vllm_models: Any) -> None:
    async def go() -> list[GenerateResult]:
        client = _client(vllm_server)
        try:
            sp = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)
            groups = [[GenerateRequest(p, sp) for _ in range(4)] for p in PROMPTS]  # 16 prompts x 4
            return [r for g in await asyncio.gather(*(client.agenerate_many(g) for g in groups)) for r in g]
        finally:
            await client.aclose()

    results = asyncio.run(go())
    model = _model(vllm_models.a)
    deviations = []
    for r in results:
        assert set(r.output_versions) == {0} and len(r.output_ids) == 24
        prox = _trainer_logprobs(model, r.input_ids + r.output_ids, len(r.input_ids))
        deviations += [abs(math.exp(p - b) - 1.0) for p, b in zip(prox, r.output_logprobs, strict=True)]
    deviations.sort()
    worst, p99 = deviations[-1], deviations[int(0.99 * (len(deviations) - 1))]
    print(f"vllm logprob parity over {len(deviations)} tokens: max |ratio - 1| {worst:.2e}, p99 {p99:.2e}")
    assert worst < 1e-3


@pytest.mark.parametrize("pause_mode", ["abort", "retract", "in_place"])
def test_update_in_the_middle_of_generation(
    vllm_server: Any, vllm_models: Any, vllm_lib: Any, tmp_path: Path, pause_mode: str
) -> None:
    store = _store(tmp_path)
    store.publish(vllm_models.a, 0)
    watcher = CheckpointWatcher(
        store, vllm_server.addresses, cache_dir=tmp_path / "cache", engine=VLLMEngine(),
        api_key=vllm_lib.KEY, pause_mode=pause_mode,  # type: ignore[arg-type]
    )  # fmt: skip
    assert watcher.poll_once() == 0  # already served: an ack, no load

    store.publish(vllm_models.b, 1)  # published now, loaded when the watcher polls below

    async def go() -> list[GenerateResult]:
        client = _client(vllm_server)
        try:
            sp = SamplingParams(max_new_tokens=N_LONG, temperature=1.0, ignore_eos=True)
            tasks = [asyncio.create_task(client.agenerate(GenerateRequest(p, sp))) for p in PROMPTS[:6]]
            await asyncio.sleep(0.2)  # the six are sent first
            # Not a fixed sleep: on an idle machine vLLM's CPU build decodes 6 x 700 tokens in about 1 s.
            stream = await until_vllm_streams(
                vllm_server.addresses[0], str(vllm_models.a), vllm_lib.KEY, chunks=50
            )
            try:
                assert await asyncio.to_thread(watcher.poll_once) == 1
            finally:
                await stream.aclose()
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    try:
        results = asyncio.run(go())
    finally:
        vllm_lib.serve(vllm_server, vllm_models.a, "0")
    old, new = _model(vllm_models.a), _model(vllm_models.b)
    mixed = 0
    for r in results:
        _versions_ok(r)
        assert len(r.output_ids) == N_LONG and set(r.output_versions) <= {0, 1}
        k = r.output_versions.count(0)
        mixed += 0 < k < len(r.output_ids)
        ids, n = r.input_ids + r.output_ids, len(r.input_ids)
        before = _trainer_logprobs(old, ids, n)[:k]
        after = {"recomputed": _trainer_logprobs(new, ids, n)[k:]}
        if pause_mode == "in_place" and k > 0:  # SGLang keeps the old KV; vLLM's CPU build recomputes it
            after["old KV cache"] = _kept_cache_logprobs(old, new, ids, n + k - 1)
        worst = {
            how: max(abs(w - g) for w, g in zip(before + want, r.output_logprobs, strict=True))
            for how, want in after.items()
        }
        assert min(worst.values()) < 1e-3, f"{pause_mode}: k={k}, worst logprob differences {worst}"
    assert mixed > 0, "no request spanned the update (it came too late or too early)"


def test_checkpoints_that_do_not_load_keep_the_old_weights(
    vllm_server: Any, vllm_models: Any, vllm_lib: Any, tmp_path: Path
) -> None:
    addr, eng = vllm_server.addresses[0], VLLMEngine()
    before = _greedy(vllm_server)
    truncated = tmp_path / "truncated"
    shutil.copytree(vllm_models.b, truncated)
    weights = truncated / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    cases = [(truncated, "truncated or damaged"), (vllm_models.wide, "another architecture")]
    for bad, why in cases:
        eng.pause(addr, "abort", api_key=vllm_lib.KEY, timeout_s=30)
        try:
            with pytest.raises(WeightUpdateError, match=why):
                eng.load_weights(addr, bad, "9", api_key=vllm_lib.KEY, timeout_s=60)
        finally:
            eng.resume(addr, api_key=vllm_lib.KEY, timeout_s=30)
        assert eng.served_version(addr, api_key=vllm_lib.KEY, timeout_s=10) == "0"
        assert _greedy(vllm_server) == before, bad  # the old weights, whole

    # Through the watcher: the store's checksums pass (the files are what was published), the engine
    # refuses another architecture; an error event, v0 keeps serving, and a good v2 is then served.
    store = _store(tmp_path)
    store.publish(vllm_models.a, 0)
    watcher = CheckpointWatcher(
        store, vllm_server.addresses, cache_dir=tmp_path / "cache", engine=VLLMEngine(), api_key=vllm_lib.KEY
    )
    assert watcher.poll_once() == 0
    store.publish(vllm_models.wide, 1)
    assert watcher.poll_once() is None and watcher.serving_version == 0
    assert "shape" in watcher.errors[-1].message and _greedy(vllm_server) == before
    store.publish(vllm_models.b, 2)
    try:
        assert watcher.poll_once() == 2 and _greedy(vllm_server) != before
    finally:
        vllm_lib.serve(vllm_server, vllm_models.a, "0")
    assert _greedy(vllm_server) == before


def test_kill_9_mid_run_restarts_and_loses_nothing(
    vllm_server: Any, vllm_models: Any, vllm_lib: Any, tmp_path: Path
) -> None:
    from rollflow.inference.fleet_link import FleetLink

    store = _store(tmp_path)
    store.publish(vllm_models.a, 0)
    store.publish(vllm_models.b, 1)
    client = _client(vllm_server)
    watcher = CheckpointWatcher(
        store, vllm_server.addresses, cache_dir=tmp_path / "cache", engine=VLLMEngine(),
        api_key=vllm_lib.KEY, pause_mode="abort", on_update=client.set_version, poll_interval_s=0.5,
    )  # fmt: skip
    assert watcher.poll_once() == 1  # serving b as v1
    supervisor = vllm_server.supervise(max_restarts=1, interval_s=0.2, startup_timeout_s=300)
    link = FleetLink(client, watcher)
    supervisor.add_listener(link)
    watcher.start()
    n_new = 1000  # within max_model_len 1024: the kill lands long before the end

    async def go() -> list[GenerateResult]:
        try:
            sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, ignore_eos=True)
            tasks = [asyncio.create_task(client.agenerate(GenerateRequest(p, sp))) for p in PROMPTS[:4]]
            await asyncio.sleep(0.2)  # the four are sent first
            stream = await until_vllm_streams(vllm_server.addresses[0], str(vllm_models.a), vllm_lib.KEY)
            os.kill(
                vllm_server.servers[0].process.pid, signal.SIGKILL
            )  # the API server, as the OOM killer would
            await stream.aclose()
            return list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()

    try:
        results = asyncio.run(go())
        deadline = time.monotonic() + 60
        while eng_version(vllm_server, vllm_lib) != "1" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert eng_version(vllm_server, vllm_lib) == "1"  # the watcher caught the restarted server up
    finally:
        watcher.stop()
        supervisor.remove_listener(link)
    assert supervisor.restarts[vllm_server.addresses[0]] == 1 and not supervisor.lost
    models = {0: _model(vllm_models.a), 1: _model(vllm_models.b)}
    for r in results:  # nothing lost: every request has all its tokens, each exact for its version
        # (a request resumed on the restarted server before its catch-up load has tokens of v0 after v1:
        # labelled as what produced them)
        assert len(r.output_ids) == n_new and r.finish_reason == "length" and r.n_interruptions >= 1
        ids, n = r.input_ids + r.output_ids, len(r.input_ids)
        tf = {v: _trainer_logprobs(m, ids, n) for v, m in models.items()}
        for i, (v, lp) in enumerate(zip(r.output_versions, r.output_logprobs, strict=True)):
            assert abs(tf[v][i] - lp) < 1e-3, (i, v)
    vllm_lib.serve(vllm_server, vllm_models.a, "0")


def eng_version(group: Any, vllm_lib: Any) -> str | None:
    try:
        return VLLMEngine().served_version(group.addresses[0], api_key=vllm_lib.KEY, timeout_s=5)
    except Exception:  # restarting
        return None
