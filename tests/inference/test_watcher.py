"""``CheckpointWatcher`` with real storage (local dir), a real CPU server and the real client.

The tests run in order on one server and one trial (versions only go up, as in a run):
v0 already served -> ack only; v1 published in the middle of a long generation -> the trajectory carries
tokens of v0 then v1 and the continuation follows the new weights; v2 corrupt -> old weights keep serving,
retried with backoff; v3 good -> served at once; v4 of another architecture -> refused by the server;
v5 through the sidecar CLI; v6 published by the trainer's ``CheckpointPublisher`` in this process wakes a
watcher whose full poll is a minute away, and is loaded from the store's own directory; v7 is seen by the
stat of LATEST alone; v8 is not seen with both wake-ups off (the control). Then separate trials: the
"loading" ack keeps GC off the version being loaded, and an S3 trial is downloaded into the cache.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import blake3
import pytest
from server_waits import until_generating

from rollflow.api.config import InferenceConfig
from rollflow.api.inference import GenerateRequest, SamplingParams
from rollflow.api.metrics import InMemorySink
from rollflow.inference.client import EngineClient
from rollflow.inference.routing import control_call
from rollflow.inference.sglang import LocalEngine
from rollflow.inference.watcher import CheckpointWatcher, default_server_id
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


def _update_mid_generation(
    pause_mode: str,
    server: Any,
    store: CheckpointStore,
    cache_dir: Path,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    inference_lib: Any,
    new_version: int,
) -> None:
    """A long greedy generation on ``server`` (serving ``tiny_model_dir``) across the publish of
    ``tiny_model_dir_b`` as ``new_version``: tokens before the update are the old policy's, after it
    the new policy's continuation of prompt + prefix, each with its own version and logprob."""
    from rollflow.clock.roles import Timeline

    addr = server.addresses[0]
    sink = InMemorySink()
    n_new = 1000
    timeline = Timeline()

    async def go() -> Any:
        client = EngineClient(server.addresses)
        w = CheckpointWatcher(
            store,
            server.addresses,
            cache_dir=cache_dir,
            poll_interval_s=0.05,
            on_update=client.set_version,
            metrics=sink,
            pause_mode=pause_mode,  # type: ignore[arg-type]
            clock=timeline.role("weights", initial="waiting"),
        )
        w.poll_once()  # v0, already served
        w.start()
        try:
            req = GenerateRequest(
                PROMPT, SamplingParams(max_new_tokens=n_new, temperature=0.0, ignore_eos=True)
            )
            task = asyncio.create_task(client.agenerate(req))
            await until_generating(addr, 60)
            await asyncio.to_thread(store.publish, tiny_model_dir_b, new_version)
            result = await task
            assert client.get_version() == new_version
            return result, w
        finally:
            w.stop()
            await client.aclose()

    r, w = asyncio.run(go())
    k = r.output_versions.index(new_version)
    old = r.output_versions[0]
    assert 60 <= k < n_new and r.output_versions == [old] * k + [new_version] * (n_new - k)
    assert len(r.output_ids) == n_new and r.finish_reason == "length"
    # abort: the server returned the partial output and the client re-submitted it; retract: the server
    # kept the request, recomputed its KV cache under the new weights and went on (no round trip).
    assert r.n_interruptions >= 1 if pause_mode == "abort" else r.n_interruptions == 0
    # The watcher's time accounting: the new version went fetching -> updating -> loading (the server
    # paused) -> updating -> waiting: the pause lies inside the round trips around it.
    states = [s for _, _, s in timeline.role("weights").spans()]
    i = states.index("loading")
    assert states[i - 3 : i + 3] == ["fetching", "waiting", "updating", "loading", "updating", "waiting"], (
        states
    )
    assert states.count("loading") == 1 and timeline.role("weights").totals()["loading"] > 0
    ids = PROMPT + r.output_ids
    n_p = len(PROMPT)
    # Up to k the old policy's greedy choices, after k the NEW policy's greedy continuation of prompt+prefix
    # (in both modes: retract recomputes the prefix's keys/values under the new weights).
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
    assert (
        ev.kind == "update"
        and ev.version == new_version
        and 0 < ev.pause_s < 5
        and 0 < ev.publish_to_serving_s < 10
    )
    assert sink.last("watcher/version") == float(new_version) and sink.last("watcher/pause_s") == ev.pause_s
    assert served_version(addr) == str(new_version)


def test_update_in_the_middle_of_a_long_generation(
    server: Any,
    store: CheckpointStore,
    cache_dir: Path,
    tiny_model_dir: Path,
    tiny_model_dir_b: Path,
    inference_lib: Any,
) -> None:
    _update_mid_generation(
        "abort", server, store, cache_dir, tiny_model_dir, tiny_model_dir_b, inference_lib, 1
    )


def test_update_with_pause_mode_retract_keeps_requests_on_the_server(
    tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any
) -> None:
    """inference.update_pause_mode=retract: same tokens and version spans as abort, no client round trip."""
    own = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "retract"))
    own.publish(tiny_model_dir, 0)
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as fresh:
        _update_mid_generation(
            "retract", fresh, own, tmp_path / "cache", tiny_model_dir, tiny_model_dir_b, inference_lib, 1
        )


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


def test_the_cpu_server_verifies_the_weights_in_the_read_that_loads_them(
    tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path, inference_lib: Any
) -> None:
    own = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "one-read"))
    own.publish(tiny_model_dir, 0)
    own.publish(tiny_model_dir_b, 1)
    stored = own.storage.local_path("checkpoints/v000001/model.safetensors")
    assert stored is not None
    data = bytearray(stored.read_bytes())
    data[-100] ^= 0xFF  # same size, other digest: only a hash of the bytes can tell
    stored.write_bytes(bytes(data))
    with inference_lib.launch_cpu_servers(tiny_model_dir, 1) as fresh:
        addr = fresh.addresses[0]
        before = greedy_tokens(addr)
        w = CheckpointWatcher(own, fresh.addresses, cache_dir=tmp_path / "cache", engine=LocalEngine())
        w.serving_version = 0
        assert w.poll_once() is None
        # the watcher left the weights' digest to the server, which refused them as it read them
        msg = w.errors[-1].message
        assert "fetch failed" not in msg and "model.safetensors" in msg and "verified as it was read" in msg
        assert served_version(addr) == "0" and greedy_tokens(addr) == before  # v0's weights still serve

        own.publish(tiny_model_dir_b, 2)  # intact: loads through the same one-read path
        assert w.poll_once() == 2 and served_version(addr) == "2"
        assert greedy_tokens(addr) == [int(x) for x in _greedy_ref(tiny_model_dir_b, inference_lib)]


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
    # SGLang's engine (the watcher's default) compares the checkpoint's headers with the served model's before
    # the server sees it (a shape mismatch crashes SGLang's real server); the CPU server's own refusal of the
    # same directory is tested in tests/infra/test_cpu_server.py
    assert "has shape [48, 128], the served model's has [48, 64]" in w.errors[-1].message
    assert served_version(addr) == "3" and greedy_tokens(addr) == before  # continued after the refusal
    assert 4 not in store.acks().values()


def test_sidecar_cli_updates_the_servers_and_stops_on_sigterm(
    server: Any, store: CheckpointStore, tmp_path: Path, tiny_model_dir_b: Path
) -> None:
    addr = server.addresses[0]
    store.publish(tiny_model_dir_b, 5)
    root = store.storage.root_uri.rsplit("/exp/trial", 1)[0]
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.watcher_sidecar", "--storage-root", root, "--experiment", "exp",
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


# --- weight propagation without polling latency -------------------------------------------------------------

SLOW_POLL_S = 60.0  # a full poll this far away cannot be what picked a version up within WAIT_S
WAIT_S = 30.0


class _NoInProcessSignal:
    """The store as a watcher in another process sees it: no in-process wake-up (stat polling only)."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def subscribe(self) -> threading.Event:
        return threading.Event()  # never set by a publish


def _watch(
    store: Any, server: Any, cache_dir: Path, **kw: Any
) -> tuple[CheckpointWatcher, dict[int, threading.Event]]:
    """A started watcher whose full poll is SLOW_POLL_S away; one event per version it serves."""
    served: dict[int, threading.Event] = {v: threading.Event() for v in range(20)}
    w = CheckpointWatcher(
        store, server.addresses, cache_dir=cache_dir, poll_interval_s=SLOW_POLL_S,
        on_update=lambda v: served[v].set(), **kw,
    )  # fmt: skip
    w.start()
    return w, served


def test_in_process_publish_wakes_the_watcher_and_is_loaded_in_place(
    server: Any, store: CheckpointStore, cache_dir: Path, tiny_model_dir_b: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from rollflow.training.publish import CheckpointPublisher

    addr = server.addresses[0]
    w, served = _watch(store, server, cache_dir, local_poll_interval_s=0)  # no stat polling: events only
    try:
        assert served[5].wait(WAIT_S)  # the first poll runs at once: v5 is already served
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir_b)
        pub = CheckpointPublisher(store, config=model.config, tokenizer=None, background=False)
        assert pub.submit(6, {k: v.detach().clone() for k, v in model.state_dict().items()}, step=6)
        assert served[6].wait(WAIT_S), f"not woken by the publish: {w.errors[-1:]}"
    finally:
        w.stop()
    ck_dir = store.storage.local_path("checkpoints/v000006")
    assert control_call(addr, "/get_model_info")["model_path"] == str(ck_dir)  # loaded in place...
    assert not (cache_dir / "v000006").exists()  # ...nothing copied into the cache
    ref = store.get(6)
    assert ref.hash_algo == "blake3"
    for name, info in ref.files.items():  # hashed while written == a fresh hash of the file
        data = (ck_dir / name).read_bytes()
        assert info == {"size": len(data), "blake3": blake3.blake3(data).hexdigest()}, name
    assert store.acks()[default_server_id(addr)] == 6


def test_a_publish_from_another_process_is_seen_by_a_stat_of_latest(
    server: Any, store: CheckpointStore, cache_dir: Path, tiny_model_dir: Path
) -> None:
    w, served = _watch(_NoInProcessSignal(store), server, cache_dir, local_poll_interval_s=0.02)
    try:
        assert served[6].wait(WAIT_S)
        store.publish(tiny_model_dir, 7)
        assert served[7].wait(WAIT_S), f"LATEST's stat change went unnoticed: {w.errors[-1:]}"
    finally:
        w.stop()
    assert served_version(server.addresses[0]) == "7"


def test_with_both_wake_ups_off_only_the_full_poll_would_see_it(
    server: Any, store: CheckpointStore, cache_dir: Path, tiny_model_dir_b: Path
) -> None:
    """The control: the two tests above pass because of the wake-ups, not some other early poll."""
    w, served = _watch(_NoInProcessSignal(store), server, cache_dir, local_poll_interval_s=0)
    try:
        assert served[7].wait(WAIT_S)
        store.publish(tiny_model_dir_b, 8)
        assert not served[8].wait(2.0)  # well short of SLOW_POLL_S; only a wake-up could have made it
    finally:
        w.stop()
    assert w.poll_once() == 8  # and a full poll does load it


class _PublishAndCollectWhileLoading:
    """A store whose ``verified_dir`` first lets the trainer publish a newer version and run GC."""

    def __init__(self, inner: CheckpointStore, newer: Path) -> None:
        self.inner, self.newer = inner, newer
        self.collected: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def verified_dir(self, version: int, cache_dir: str | Path, *, defer_weights: bool = False) -> Path:
        self.inner.publish(self.newer, version + 1)
        self.collected += self.inner.gc(keep_last=1)  # keeps only version + 1 -- unless an ack protects
        return self.inner.verified_dir(version, cache_dir, defer_weights=defer_weights)


def test_gc_cannot_delete_the_version_a_server_is_loading(
    server: Any, tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    fresh = CheckpointStore(Storage.open(str(tmp_path / "store"), "exp", "gc-trial"))
    fresh.publish(tiny_model_dir_b, 1)
    store = _PublishAndCollectWhileLoading(fresh, tiny_model_dir)
    w = CheckpointWatcher(store, server.addresses, cache_dir=tmp_path / "cache", server_ids=["fresh"])
    assert w.poll_once() == 1, w.errors[-1:]  # a new server: no ack before this poll's "loading" ack
    assert store.collected == [] and fresh.list_committed() == [1, 2]
    assert fresh.acks() == {"fresh": 1}
    assert fresh.get(1).version == 1


@pytest.mark.s3
def test_s3_checkpoint_is_verified_into_the_cache_and_polled_at_the_full_interval(
    server: Any, s3_server: Any, tmp_path: Path, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    s3 = CheckpointStore(
        Storage.open(f"s3://{s3_server.bucket}/w", "exp", f"t-{os.getpid()}", s3_server.options)
    )
    s3.publish(tiny_model_dir, 11)
    w = CheckpointWatcher(s3, server.addresses, cache_dir=tmp_path / "cache", poll_interval_s=0.25)
    assert w.poll_once() == 11, w.errors[-1:]
    assert control_call(server.addresses[0], "/get_model_info")["model_path"] == str(
        tmp_path / "cache" / "v000011"
    )

    s3.publish(tiny_model_dir_b, 12)
    key = "checkpoints/v000012/model.safetensors"
    data = bytearray(s3.storage.get_bytes(key))
    data[-1] ^= 1
    s3.storage.put_bytes(key, bytes(data))
    assert w.poll_once() is None
    assert "CheckpointIntegrityError" in w.errors[-1].message and "blake3" in w.errors[-1].message
    assert served_version(server.addresses[0]) == "11"

    calls: list[float] = []
    real = s3.latest_version
    s3.latest_version = lambda: calls.append(time.monotonic()) or real()  # type: ignore[method-assign]
    assert s3.latest_token() is None  # nothing cheap to stat on S3: only full polls
    w.start()
    time.sleep(1.0)
    w.stop()
    assert 1 <= len(calls) <= 6  # ~1 s / 0.25 s full polls (+ the first), not a tight loop
