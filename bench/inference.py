"""Inference benchmark: the CPU server and the weight-update path against plain transformers.

Run:  .venv/bin/python -m bench.inference            (about 2-4 minutes on 2 cores)
      .venv/bin/python -m bench.inference --quick    (fewer repetitions, smoke run)

Prints one `name value` line per figure and writes them to bench/results/inference.json (raw timings and
the models used in inference_details.json). Models are random Llamas built here (no hub):

- throughput model "bench-4m": hidden 256, 4 layers, 4 heads (2 KV), MLP 688, vocab 2048, fp32 (3.95M
  parameters, the size of the 4.7M row in notes/stack.md); the 0.8M test model is too small: at that
  size a decode step is mostly Python overhead on either side.
- weight-update model "bench-32m": hidden 512, 8 layers, 8 heads (4 KV), MLP 1408, vocab 8192, fp32
  (32M parameters, 128 MB of safetensors), large enough that loading is not lost in the poll interval.

Figures:

- server_vs_hf_generate_c16 / _c64: server tokens/s with 16 / 64 concurrent requests (prompt 33 tokens,
  31 new, temperature 1, sent through ``EngineClient``), over ``model.generate`` tokens/s on the same
  batch in-process (same sampling, same torch threads). Best of the repetitions on each side. >= 0.7 is
  the target.
- weight_update_vs_raw_load: publish -> serving latency (``CheckpointStore.publish`` returns -> the
  watcher's ``on_update``: wake-up, LATEST + COMMIT.json, "loading" ack, the layout and sizes checked in
  place, pause, the server's one read of each weight file with its blake3 hash beside it + check +
  in-place swap, continue, ack) over a plain
  ``AutoModelForCausalLM.from_pretrained`` of the same committed checkpoint directory, in a warm
  process. The watcher runs with the config defaults (``inference.poll_interval_s`` 1 s,
  ``local_poll_interval_s`` 0.02 s) and, as in the embedded mode, in the publisher's process, so the
  publish wakes it. Medians, interleaved. <= 1.5 is the target.
  Also reported: weight_update_s, raw_load_s, weight_update_vs_raw_load_touch (from_pretrained +
  reading every weight, since from_pretrained maps the file lazily), weight_update_vs_server_restart
  (a fresh CPU server process on the new checkpoint until /health: the alternative to hot-loading),
  fetch_s (the watcher's own check: listing, links, sizes and the small files' digests; the weights'
  digests are checked by the server as it reads them), and
  weight_update_stat_poll_vs_raw_load (the same with the in-process wake-up hidden, as for a watcher in
  another process: only the stat of LATEST every 0.02 s sees the publish).
- server_load_vs_raw: the CPU server's load in-process, no HTTP (``load_checked_weights`` +
  ``swap_weights_in_place``: read, copy into private memory in the served dtype, shape/dtype/finite
  checks, pointer swap; without a COMMIT.json to check, so no hash) over ``safetensors.torch.load_file`` + ``model.load_state_dict``. Medians of
  interleaved repetitions.
- pause_s: median time generation stops on the server during an update (pause -> continue), measured
  while 8 client streams keep generating. The update figures are taken twice: on an idle server (the
  main figures) and while those 8 streams generate (``*_generating``: the fetch then competes with
  generation for the 2 cores).

Engines side by side (``bench_engines``; ``--engines`` runs only this part): for each engine that runs
here, ``local`` (rollflow's CPU server), ``vllm`` (vLLM's CPU build from ``.venv-vllm``) and ``sglang``
(SGLang's real server from ``.venv-sglang``, on its plain-torch CPU path), one server at a time,
alternating local, vllm, sglang, local, ... ``--engine-reps`` times (3 by default), each time a fresh
server on the "bench-engine" model (hidden 128, 4 layers, 4 heads of 32 (2 KV), MLP 344, vocab 512, fp32,
0.9M parameters; vLLM's CPU attention has no head size 16), each with 2 torch threads. Keys are prefixed
by the engine (``local_``, ``vllm_``, ``sglang_``), with the median over the repetitions and, as
``*_min`` / ``*_max``, the spread:

- completions_per_s_c16 / _c128: 64 prompts (16 tokens) x n = 8, 8 new tokens, T = 1, per-token logprobs,
  through ``EngineClient`` with at most 16 / 128 completions in flight (groups of 8 sent whole: one
  batched ``/generate`` for SGLang and the CPU server, one request with ``n = 8`` for vLLM);
- server_start_s: launch -> first completion; server_rss_mb: resident memory of the server's processes
  (all of its process group: vLLM runs 3-4), after the throughput runs;
- weight_update_s: ``CheckpointStore.publish`` -> every server serves it (the watcher in this process,
  pause mode abort), median of 3 updates; weight_update_vs_raw_load: that over a plain
  ``from_pretrained`` of the same directory; pause_s: the watcher's pause -> resume.

Not a test: it asserts nothing about targets; it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench._common import report

PROMPT_LEN, NEW_TOKENS = 33, 31
THREADS = 2
THROUGHPUT_ARCH = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=688, vocab_size=2048, max_position_embeddings=512)  # fmt: skip
UPDATE_ARCH = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                   intermediate_size=1408, vocab_size=8192, max_position_embeddings=512)  # fmt: skip


def build_model(path: Path, arch: dict[str, Any], seed: int) -> Path:
    """A random LlamaForCausalLM saved as safetensors; no tokenizer, no EOS (generation runs to length)."""
    from transformers import GenerationConfig

    from rollflow.models.random_llama import save_random_llama

    return save_random_llama(
        path, seed=seed, generation_config=GenerationConfig(eos_token_id=None, pad_token_id=0),
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, **arch,
    )  # fmt: skip


def n_params(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = f.keys()  # safe_open is not iterable
        return sum(math.prod(f.get_slice(k).get_shape()) for k in names)


def prompts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, PROMPT_LEN), generator=g).tolist()


# --- throughput -----------------------------------------------------------------------------------------------


def hf_generate_s(model: Any, batch: int, vocab: int, seed: int) -> float:
    ids = torch.tensor(prompts(batch, vocab, seed))  # [B, 33]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0,
        )  # fmt: skip
    dt = time.perf_counter() - t0
    assert out.shape == (batch, PROMPT_LEN + NEW_TOKENS)
    return dt


async def server_generate_s(client: Any, batch: int, vocab: int, seed: int) -> float:
    from rollflow.api.inference import GenerateRequest, SamplingParams

    sp = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, ignore_eos=True)
    reqs = [GenerateRequest(p, sp) for p in prompts(batch, vocab, seed)]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(client.agenerate(r) for r in reqs))
    dt = time.perf_counter() - t0
    assert all(len(o.output_ids) == NEW_TOKENS for o in outs)
    return dt


def bench_throughput(root: Path, reps: int, details: dict[str, Any]) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from infra.servers import launch_local_servers
    from rollflow.api.config import InferenceConfig
    from rollflow.inference.client import EngineClient

    model_dir = build_model(root / "bench-4m", THROUGHPUT_ARCH, seed=0)
    vocab = THROUGHPUT_ARCH["vocab_size"]
    details["throughput_model"] = {"arch": THROUGHPUT_ARCH, "params": n_params(model_dir), "threads": THREADS}
    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = InferenceConfig(n_servers=1, server_threads=THREADS, max_batch_size=64)
    figures: dict[str, float] = {}
    with launch_local_servers(cfg, model_dir) as group:
        client = EngineClient(group.addresses)
        loop = asyncio.new_event_loop()
        try:
            for batch in (16, 64):
                hf_generate_s(model, batch, vocab, seed=99)  # warm-up both sides
                loop.run_until_complete(server_generate_s(client, batch, vocab, seed=99))
                hf, srv = [], []
                for i in range(reps):  # interleaved: machine noise hits both sides alike
                    hf.append(hf_generate_s(model, batch, vocab, seed=i))
                    srv.append(loop.run_until_complete(server_generate_s(client, batch, vocab, seed=i)))
                tokens = batch * NEW_TOKENS
                hf_tps, srv_tps = tokens / min(hf), tokens / min(srv)
                figures[f"server_vs_hf_generate_c{batch}"] = srv_tps / hf_tps
                details[f"c{batch}"] = {
                    "hf_s": hf,
                    "server_s": srv,
                    "hf_tok_s": hf_tps,
                    "server_tok_s": srv_tps,
                }
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
    return figures


# --- weight update ----------------------------------------------------------------------------------------------


class _Load:
    """Background generation load: `streams` client loops on their own event loop thread."""

    def __init__(self, addresses: list[str], streams: int, vocab: int) -> None:
        self.addresses, self.streams, self.vocab = addresses, streams, vocab
        self.stop = threading.Event()
        self.tokens = 0
        self.interruptions = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        from rollflow.api.inference import GenerateRequest, SamplingParams
        from rollflow.inference.client import EngineClient

        client = EngineClient(self.addresses)

        async def stream(i: int) -> None:
            sp = SamplingParams(max_new_tokens=64, ignore_eos=True)
            while not self.stop.is_set():
                r = await client.agenerate(GenerateRequest(prompts(1, self.vocab, i)[0], sp))
                self.tokens += len(r.output_ids)
                self.interruptions += r.n_interruptions

        await asyncio.gather(*(stream(i) for i in range(self.streams)))
        await client.aclose()


def server_restart_s(model_dir: Path) -> float:
    """The no-hot-reload alternative: a fresh CPU server process on the new checkpoint until /health."""
    from infra.servers import launch_local_servers
    from rollflow.api.config import InferenceConfig

    t0 = time.perf_counter()
    with launch_local_servers(InferenceConfig(n_servers=1, server_threads=THREADS), model_dir):
        dt = time.perf_counter() - t0
    return dt


class _NoInProcessWakeUp:
    """The store as a watcher in another process sees it: a publish here does not wake it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def subscribe(self) -> threading.Event:
        return threading.Event()


def bench_server_load(root: Path, reps: int, details: dict[str, Any]) -> dict[str, float]:
    """The CPU server's load path in-process vs safetensors.load_file + load_state_dict."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from infra.cpu_server.weights import load_checked_weights, read_config, swap_weights_in_place

    dirs = [root / f"bench-32m-{s}" for s in (0, 1)]
    model = AutoModelForCausalLM.from_pretrained(dirs[0], dtype=torch.float32).eval()
    served_cfg = read_config(dirs[0])
    ours: list[float] = []
    raw: list[float] = []
    for i in range(reps + 1):  # the first round warms both sides up
        d = dirs[i % 2]
        for name in ("ours", "raw") if i % 2 == 0 else ("raw", "ours"):
            t0 = time.perf_counter()
            if name == "ours":
                swap_weights_in_place(model, load_checked_weights(model, served_cfg, str(d)))
            else:
                with torch.no_grad():
                    model.load_state_dict(load_file(str(d / "model.safetensors")))
            (ours if name == "ours" else raw).append(time.perf_counter() - t0)
    ours, raw = ours[1:], raw[1:]
    details["server_load"] = {"ours_s": ours, "raw_s": raw}
    return {"server_load_vs_raw": statistics.median(ours) / statistics.median(raw)}


def bench_weight_update(root: Path, reps: int, details: dict[str, Any]) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from infra.servers import launch_local_servers
    from rollflow.api.config import InferenceConfig
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    weights = [build_model(root / f"bench-32m-{s}", UPDATE_ARCH, seed=s) for s in (0, 1)]
    size = sum(f.stat().st_size for f in weights[0].iterdir())
    details["update_model"] = {"arch": UPDATE_ARCH, "params": n_params(weights[0]), "bytes": size}
    store = CheckpointStore(Storage.open(str(root / "store"), "bench", "trial"))
    store.publish(weights[0], 0)
    served = threading.Event()
    cfg = InferenceConfig(n_servers=1, server_threads=THREADS, max_batch_size=64)
    phases: dict[str, dict[str, list[float]]] = {}
    version = 0
    with launch_local_servers(cfg, weights[0]) as group:

        def new_watcher(source: Any) -> CheckpointWatcher:
            w = CheckpointWatcher.from_config(
                cfg, source, group.addresses, cache_dir=root / "cache", on_update=lambda v: served.set()
            )
            w.poll_once()  # what the server already serves
            w.start()
            return w

        watcher = new_watcher(store)
        load = _Load(group.addresses, streams=8, vocab=UPDATE_ARCH["vocab_size"])
        try:
            for phase in ("idle", "idle_stat_poll", "generating"):
                if phase == "idle_stat_poll":  # a watcher in another process: no in-process wake-up
                    watcher.stop()
                    watcher = new_watcher(_NoInProcessWakeUp(store))
                if phase == "generating":
                    watcher.stop()
                    watcher = new_watcher(store)
                    load.thread.start()
                t = phases[phase] = {k: [] for k in ("latency", "raw", "raw_touch", "pause", "fetch")}
                for _ in range(reps):
                    ck_dir = Path(store.storage.local_path(f"checkpoints/v{version:06d}") or "")
                    t0 = time.perf_counter()  # raw: loading this checkpoint without the machinery
                    AutoModelForCausalLM.from_pretrained(ck_dir, dtype=torch.float32)
                    t["raw"].append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    m = AutoModelForCausalLM.from_pretrained(ck_dir, dtype=torch.float32)
                    sum(float(p.detach().sum()) for p in m.parameters())
                    t["raw_touch"].append(time.perf_counter() - t0)
                    del m
                    version += 1
                    served.clear()
                    store.publish(weights[version % 2], version)
                    t0 = time.perf_counter()
                    assert served.wait(120), f"v{version} never served: {watcher.errors[-1:]}"
                    t["latency"].append(time.perf_counter() - t0)
                    ev = watcher.events[-1]
                    t["pause"].append(ev.pause_s or 0.0)
                    t["fetch"].append(ev.fetch_s or 0.0)
                    time.sleep(0.3)  # let generation run between updates
        finally:
            watcher.stop()
            load.stop.set()
            if load.thread.is_alive():
                load.thread.join(60)
    last = Path(store.storage.local_path(f"checkpoints/v{version:06d}") or "")
    restart = [server_restart_s(last) for _ in range(2)]
    med = statistics.median
    idle, busy = phases["idle"], phases["generating"]
    stat = phases["idle_stat_poll"]
    details["weight_update"] = {
        "phases": phases, "poll_interval_s": cfg.poll_interval_s, "local_poll_interval_s": cfg.local_poll_interval_s,
        "load_streams": 8, "restart_s": restart, "load_tokens": load.tokens,
        "load_interruptions": load.interruptions, "errors": len(watcher.errors),
    }  # fmt: skip
    return {
        "weight_update_vs_raw_load": med(idle["latency"]) / med(idle["raw"]),
        "weight_update_stat_poll_vs_raw_load": med(stat["latency"]) / med(stat["raw"]),
        "weight_update_vs_raw_load_touch": med(idle["latency"]) / med(idle["raw_touch"]),
        "weight_update_vs_raw_load_generating": med(busy["latency"]) / med(busy["raw"]),
        "weight_update_vs_server_restart": med(idle["latency"]) / med(restart),
        "weight_update_s": med(idle["latency"]),
        "weight_update_generating_s": med(busy["latency"]),
        "raw_load_s": med(idle["raw"]),
        "fetch_s": med(idle["fetch"]),
        "fetch_generating_s": med(busy["fetch"]),
        "pause_s": med(busy["pause"]),
    }


# --- engines side by side ----------------------------------------------------------------------------------------

ENGINE_ARCH = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=344, vocab_size=512, max_position_embeddings=256)  # fmt: skip
ENGINE_PROMPTS, ENGINE_N, ENGINE_PROMPT_LEN, ENGINE_NEW = 64, 8, 16, 8


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every process in its group (vLLM's engine core and workers)."""
    import psutil

    pgid = os.getpgid(pid)
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                total += proc.memory_info().rss
        except (ProcessLookupError, psutil.Error):
            continue
    return total / 2**20


async def _engine_batch(client: Any, concurrency: int, seed: int) -> float:
    """Seconds for 64 prompts x n = 8 with at most ``concurrency`` completions in flight."""
    from rollflow.api.inference import GenerateRequest, SamplingParams

    sp = SamplingParams(max_new_tokens=ENGINE_NEW, temperature=1.0, ignore_eos=True)
    groups = prompts(ENGINE_PROMPTS, ENGINE_ARCH["vocab_size"], seed)
    gate = asyncio.Semaphore(max(1, concurrency // ENGINE_N))

    async def group(p: list[int]) -> None:
        async with gate:
            outs = await client.agenerate_many(
                [GenerateRequest(p[:ENGINE_PROMPT_LEN], sp) for _ in range(ENGINE_N)]
            )
        assert all(len(o.output_ids) == ENGINE_NEW for o in outs)

    t0 = time.perf_counter()
    await asyncio.gather(*(group(p) for p in groups))
    return time.perf_counter() - t0


def _launch(engine: str, model_dir: Path) -> Any:
    from rollflow.api.config import InferenceConfig, SGLangConfig, VLLMConfig

    cfg = InferenceConfig(
        backend=engine, n_servers=1, server_threads=THREADS, max_batch_size=128,  # type: ignore[arg-type]
        vllm=VLLMConfig(dtype="float32", max_model_len=256, enforce_eager=True),
        sglang=SGLangConfig(device="cpu", startup_timeout_s=300.0),
    )  # fmt: skip
    if engine == "sglang":
        from infra.sglang_launcher import launch_sglang_servers

        return cfg, launch_sglang_servers(cfg, model_dir, dtype="float32")
    if engine == "vllm":
        from infra.vllm_launcher import launch_vllm_servers

        return cfg, launch_vllm_servers(cfg, model_dir)
    from infra.servers import launch_local_servers

    return cfg, launch_local_servers(cfg, model_dir)


def _engine_once(engine: str, root: Path, models: list[Path], rep: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from rollflow.api.inference import GenerateRequest, SamplingParams
    from rollflow.inference.client import EngineClient
    from rollflow.inference.engines import engine_for
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    out: dict[str, float] = {}
    t0 = time.perf_counter()
    cfg, group = _launch(engine, models[0])
    try:
        client = EngineClient(group.addresses, engine=engine_for(engine))
        loop = asyncio.new_event_loop()
        try:
            sp = SamplingParams(max_new_tokens=ENGINE_NEW, temperature=1.0)
            loop.run_until_complete(client.agenerate(GenerateRequest([1, 2, 3], sp)))
            out["server_start_s"] = time.perf_counter() - t0
            for c in (16, 128):
                loop.run_until_complete(_engine_batch(client, c, seed=99))  # warm-up
                dt = loop.run_until_complete(_engine_batch(client, c, seed=rep))
                out[f"completions_per_s_c{c}"] = ENGINE_PROMPTS * ENGINE_N / dt
            out["server_rss_mb"] = _rss_mb(group.servers[0].process.pid)
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
        store = CheckpointStore(Storage.open(str(root / f"store-{engine}-{rep}"), "bench", "trial"))
        store.publish(models[0], 0)
        served = threading.Event()
        watcher = CheckpointWatcher(
            store, group.addresses, cache_dir=root / "cache", engine=engine_for(engine), pause_mode="abort",
            on_update=lambda v: served.set(),
        )  # fmt: skip
        watcher.poll_once()
        watcher.start()
        lat, raw, pause = [], [], []
        try:
            for v in (1, 2, 3):
                served.clear()
                store.publish(models[v % 2], v)
                t1 = time.perf_counter()
                assert served.wait(120), f"{engine}: v{v} never served: {watcher.errors[-1:]}"
                lat.append(time.perf_counter() - t1)
                pause.append(watcher.events[-1].pause_s or 0.0)
                ck = Path(store.storage.local_path(f"checkpoints/v{v:06d}") or "")
                t1 = time.perf_counter()
                AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32)
                raw.append(time.perf_counter() - t1)
        finally:
            watcher.stop()
        med = statistics.median
        out.update(
            weight_update_s=med(lat), weight_update_vs_raw_load=med(lat) / med(raw), pause_s=med(pause)
        )
    finally:
        group.stop()
    return out


def _add_tokenizer(model_dir: Path, vocab: int) -> Path:
    """A word-level tokenizer of ``vocab`` tokens ``t0``, ``t1``, ...: vLLM will not start without one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0").save_pretrained(model_dir)
    return model_dir


def bench_engines(
    root: Path, reps: int, details: dict[str, Any], engines: tuple[str, ...]
) -> dict[str, float]:
    """Each engine's figures, alternating engines within every repetition (see the module docstring)."""
    vocab = ENGINE_ARCH["vocab_size"]
    models = [
        _add_tokenizer(build_model(root / f"bench-engine-{s}", ENGINE_ARCH, seed=s), vocab) for s in (0, 1)
    ]
    details["engine_model"] = {"arch": ENGINE_ARCH, "params": n_params(models[0]), "threads": THREADS}
    runs: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
    for rep in range(reps):
        for engine in engines:
            runs[engine].append(_engine_once(engine, root, models, rep))
            print(
                f"# {engine} rep {rep}: {json.dumps({k: round(v, 3) for k, v in runs[engine][-1].items()})}"
            )
    details["engines"] = runs
    figures: dict[str, float] = {}
    for engine, rows in runs.items():
        for key in rows[0]:
            values = [r[key] for r in rows]
            figures[f"{engine}_{key}"] = statistics.median(values)
            figures[f"{engine}_{key}_min"] = min(values)
            figures[f"{engine}_{key}_max"] = max(values)
    return figures


def default_engines() -> tuple[str, ...]:
    """``local``, and ``vllm`` / ``sglang`` too when their venvs are there; else say how to add them (``make
    bench`` after ``make install`` has neither ``.venv-vllm`` nor ``.venv-sglang``)."""
    from infra.sglang_launcher import sglang_python
    from infra.vllm_launcher import vllm_python
    from rollflow.api.config import InferenceConfig
    from rollflow.api.errors import ServerStartupError

    engines = ["local"]
    for name, find in (("vllm", vllm_python), ("sglang", sglang_python)):
        try:
            find(InferenceConfig())
            engines.append(name)
        except ServerStartupError as exc:
            print(f"engines: no {name}; {exc}", file=sys.stderr)
    return tuple(engines)


def main() -> None:
    ap = argparse.ArgumentParser(description="Inference benchmarks (see module docstring).")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument(
        "--engines", action="store_true", help="only the engines side by side (local_*, vllm_*, sglang_*)"
    )
    ap.add_argument("--engine-reps", type=int, default=3, help="repetitions of the engine comparison")
    ap.add_argument(
        "--engine",
        action="append",
        choices=["local", "vllm", "sglang"],
        help="engines to compare (default: local, and vllm / sglang when .venv-vllm / .venv-sglang are there)",
    )
    args = ap.parse_args()
    reps = 2 if args.quick else 5
    details: dict[str, Any] = {"machine": platform.platform(), "torch": torch.__version__, "reps": reps}
    details["load_avg_at_start"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rollflow-bench-inference-") as tmp:
        root = Path(tmp)
        figures: dict[str, float] = {}
        if not args.engines:
            figures.update(bench_throughput(root, reps + 2, details))
            figures.update(bench_weight_update(root, reps, details))
            figures.update(bench_server_load(root, reps, details))
        engines = tuple(args.engine or default_engines())
        figures.update(bench_engines(root, 1 if args.quick else args.engine_reps, details, engines))
    details["load_avg_at_end"] = os.getloadavg()
    report("inference_engines" if args.engines else "inference", figures, details)
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
