"""``CheckpointWatcher`` with real storage (local dir), a real CPU server and the real client.

The tests run in order on one server and one trial (versions only go up, as in a run):
v0 already served -> ack only; v1 published in the middle of a long generation -> the trajectory carries
tokens of v0 then v1 and the continuation follows the new weights; v2 corrupt -> old weights keep serving,
retried with backoff; v3 good -> served at once; v4 of another architecture -> refused by the server;
v5 through the sidecar CLI.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rollflow.api.config import InferenceConfig
from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.api.metrics import InMemorySink
from rollflow.rollout.client import SGLangClient
from rollflow.rollout.routing import control_call
from rollflow.rollout.watcher import CheckpointWatcher, default_server_id
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, inference_lib: Any) -> Any:
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as group:
        yield group


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CheckpointStore:
    return CheckpointStore(Storage.open(str(tmp_path_factory.mktemp("store")), "exp", "trial"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def served_version(addr: str) -> str:
    return str(control_call(addr, "/get_model_info")["weight_version"])


def greedy_tokens(addr: str, n: int = 12) -> list[int]:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }
    return control_call(addr, "/generate", body)["output_ids"]


def test_first_poll_acks_the_version_already_served(
    server: Any, store: CheckpointStore, cache_dir: Path, tiny_model_dir: Path
) -> None:
    addr = server.addresses[0]
    store.publish(tiny_model_dir, 0)
    seen: list[int] = []
    w = CheckpointWatcher(store, server.addresses, cache_dir=cache_dir, on_update=seen.append)
    assert w.poll_once() == 0 and seen == [0]
    assert w.events[-1].kind == "update" and w.events[-1].pause_s == 0.0  # "0" already served: no pause
    assert store.acks() == {default_server_id(addr): 0}
    assert w.poll_once() is None  # nothing new
    w2 = CheckpointWatcher.from_config(
        InferenceConfig(poll_interval_s=0.3, weight_update_timeout_s=9.0, api_key="k"),
        store,
        [addr],
        cache_dir=cache_dir,
    )
    assert (w2.poll_interval_s, w2.request_timeout_s, w2.api_key) == (0.3, 9.0, "k")


def test_update_in_the_middle_of_a_long_generation(
    server: Any,
    store: CheckpointStore,
    cache_dir: Path,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    inference_lib: Any,
) -> None:
    addr = server.addresses[0]
    sink = InMemorySink()
    n_new = 1000

    async def go() -> Any:
        client = SGLangClient(server.addresses)
        w = CheckpointWatcher(
            store,
            server.addresses,
            cache_dir=cache_dir,
            poll_interval_s=0.05,
            on_update=client.set_version,
            metrics=sink,
        )
        w.poll_once()  # v0, already served
        w.start()
        try:
            req = GenerateRequest(
                PROMPT, SamplingParams(max_new_tokens=n_new, temperature=0.0, ignore_eos=True)
            )
            task = asyncio.create_task(client.agenerate(req))
            deadline = time.monotonic() + 10
            while control_call(addr, "/get_server_info")["internal_states"][0]["running_output_tokens"] < 60:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await asyncio.to_thread(store.publish, tiny_model_dir_b, 1)
            result = await task
            assert client.get_version() == 1
            return result, w
        finally:
            w.stop()
            await client.aclose()

    r, w = asyncio.run(go())
    k = r.output_versions.index(1)
    assert 60 <= k < n_new and r.output_versions == [0] * k + [1] * (n_new - k)
    assert len(r.output_ids) == n_new and r.n_interruptions >= 1 and r.finish_reason == "length"
    ids = PROMPT + r.output_ids
    n_p = len(PROMPT)
    # Up to k the old policy's greedy choices, after k the NEW policy's greedy continuation of prompt+prefix.
    for model_dir, lo, hi in ((tiny_model_dir, n_p, n_p + k), (tiny_model_dir_b, n_p + k, len(ids))):
        logits = inference_lib.teacher_forced_logits(model_dir, ids)  # [T, V]
        for t in range(lo, hi):
            assert logits[t - 1, ids[t]] >= logits[t - 1].max() - 1e-4, (
                f"token {t} is not {model_dir.name}'s greedy"
            )
        ref = inference_lib.teacher_forced_logprobs(model_dir, ids, n_p)[lo - n_p : hi - n_p]
        assert (
            max(abs(a - b) for a, b in zip(r.output_logprobs[lo - n_p : hi - n_p], ref, strict=True)) < 1e-4
        )
    ev = w.events[-1]
    assert ev.kind == "update" and ev.version == 1 and 0 < ev.pause_s < 5 and 0 < ev.publish_to_serving_s < 10
    assert sink.last("watcher/version") == 1.0 and sink.last("watcher/pause_s") == ev.pause_s
    assert served_version(addr) == "1"


def test_corrupt_checkpoint_keeps_the_old_version_serving(
    server: Any,
    store: CheckpointStore,
    cache_dir: Path,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    inference_lib: Any,
) -> None:
    addr = server.addresses[0]
    before = greedy_tokens(addr)
    store.publish(tiny_model_dir, 2)
    stored = store.storage.local_path("checkpoints/v000002/model.safetensors")
    assert stored is not None
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0xFF  # same size, different sha256
    stored.write_bytes(bytes(data))

    w = CheckpointWatcher(store, server.addresses, cache_dir=cache_dir, poll_interval_s=0.5)
    w.serving_version = 1
    assert w.poll_once() is None
    assert (
        len(w.errors) == 1
        and "CheckpointIntegrityError" in w.errors[0].message
        and "model.safetensors" in w.errors[0].message
    )
    assert served_version(addr) == "1" and greedy_tokens(addr) == before  # still v1's weights, not paused
    assert w.poll_once() is None and len(w.errors) == 1  # backoff: no retry right away (no hot loop)
    time.sleep(0.6)
    assert w.poll_once() is None and len(w.errors) == 2  # retried after poll_interval_s * 2**0
    assert w.poll_once() is None and len(w.errors) == 2  # next retry only after 1.0 s

    store.publish(tiny_model_dir, 3)  # a newer good version is tried at once
    assert w.poll_once() == 3 and served_version(addr) == "3"
    assert greedy_tokens(addr) == [int(x) for x in _greedy_ref(tiny_model_dir, inference_lib)]


def _greedy_ref(model_dir: Path, lib: Any, n: int = 12) -> list[int]:
    ids = list(PROMPT)
    for _ in range(n):
        ids.append(int(lib.teacher_forced_logits(model_dir, ids)[-1].argmax()))
    return ids[len(PROMPT) :]


def test_server_refusing_the_weights_is_an_error_and_keeps_serving(
    server: Any, store: CheckpointStore, cache_dir: Path, tmp_path: Path, inference_lib: Any
) -> None:
    addr = server.addresses[0]
    before = greedy_tokens(addr)
    store.publish(inference_lib.write_tiny_model(tmp_path / "wide", seed=5, hidden_size=128), 4)
    w = CheckpointWatcher(store, server.addresses, cache_dir=cache_dir)
    w.serving_version = 3
    assert w.poll_once() is None
    assert (
        "update refused" in w.errors[-1].message and "does not match the served model" in w.errors[-1].message
    )
    assert served_version(addr) == "3" and greedy_tokens(addr) == before  # continued after the refusal
    assert 4 not in store.acks().values()


def test_sidecar_cli_updates_the_servers_and_stops_on_sigterm(
    server: Any, store: CheckpointStore, tmp_path: Path, tiny_model_dir_b: Path
) -> None:
    addr = server.addresses[0]
    store.publish(tiny_model_dir_b, 5)
    root = store.storage.root_uri.rsplit("/exp/trial", 1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollflow.rollout.watcher", "--storage-root", root, "--experiment", "exp",
         "--trial", "trial", "--servers", addr, "--cache-dir", str(tmp_path / "c"), "--poll-interval-s", "0.1"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while served_version(addr) != "5":
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "sidecar never updated the server"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=15)[0].decode()
    assert proc.returncode == 0, out
    assert "serving v5" in out
