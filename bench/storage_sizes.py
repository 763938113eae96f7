"""Checkpoint storage at real model sizes: publish, fetch + verify and load of a Qwen2-shaped model.

Run:  python -m bench.storage --size 0.5b         (about 1 GB of bf16 weights; ~2 minutes on 2 cores)
      python -m bench.storage --size 1.5b --lora  (3.1 GB, plus a rank-64 adapter on that shape)
      python -m bench.storage --size tiny --reps 1 (a smoke run, seconds)

A Qwen2.5-shaped model (``bench/qwen2_shapes.py``) is built from its config with random bf16 weights, no
hub. Each figure is median(ours) / median(raw) over ``--reps`` interleaved repetitions, both sides moving
the same tensors on the same disk (``--dir``, default the system temp dir):

- publish_vs_raw: ``CheckpointPublisher.submit`` (write_hf_dir: config.json + model.safetensors, hashed
  while written, then COMMIT.json and LATEST) vs ``safetensors.torch.save_file`` of the same tensors;
- fetch_vs_raw: ``CheckpointStore.fetch`` (a private copy, every file verified against COMMIT.json) vs
  ``shutil.copytree`` of the same directory;
- load_vs_raw: the one-read load, what the CPU server does on a local root:
  ``CheckpointStore.verified_dir(defer_weights=True)`` (listing, links, sizes, small files hashed) +
  ``load_verified_dir(into=...)`` (each weight file read once, straight into a second, already built
  model's tensors, while a second thread hashes the same bytes; checked against COMMIT.json before the
  model is used), vs ``load_file`` + ``load_state_dict`` of the raw file into the same model;
- ``*_GBps``: checkpoint bytes / median seconds, ours and raw;
- ``load_two_reads_vs_raw``: the path before the one-read load (``verified_dir`` hashing every file in
  place, all cores, then ``load_file`` + ``load_state_dict``), interleaved with the others: an A/B on the
  same machine;
- the bound: ``hash_1core_GBps`` / ``hash_allcore_GBps`` (blake3 over 256 MiB in memory, best of 4),
  ``raw_read_GBps`` (the raw file read from the page cache into a buffer), and ``load_floor_vs_raw`` =
  (raw load s + bytes / best hash rate) / raw load s: what a load that hashes every byte once before
  using it cannot beat on this machine; ``load_overlap_floor_vs_raw`` = max(raw load s, bytes / best
  hash rate) / raw load s: the one-read load's floor, the hash fully beside the read on another core
  (``publish_floor_vs_raw`` likewise over the raw save).
  ``load_vs_raw_16core_computed`` is that floor with 16 cores at this machine's one-core rate: computed,
  not measured.

With ``--lora`` the same for a rank-64 adapter on every linear layer of the same shape (``lora_*``; load
is the tensors alone: the one-read ``load_verified_safetensors`` vs ``load_file``).

Caveat: the files are hot in the page cache (24 GiB of RAM here holds them), so load and fetch measure
hashing and copying, not the disk. Not a test: it reports.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bench import qwen2_shapes
from bench._common import hash_throughput, interleaved, median, ratio
from rollflow.models.verified_weights import load_verified_dir, load_verified_safetensors
from rollflow.training.publish import CheckpointPublisher, tied_aliases
from storage import keys
from storage.checkpoints import ADAPTER_WEIGHTS_NAME, CheckpointStore
from storage.fs import Storage

WEIGHTS = "model.safetensors"


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def read_GBps(path: Path, reps: int = 3) -> float:
    """GB/s of reading ``path`` (hot in the page cache) into one preallocated buffer, median of ``reps``."""
    size = path.stat().st_size
    buf = bytearray(size)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            view, got = memoryview(buf), 0
            while got < size and (n := f.readinto(view[got:])):
                got += n
        times.append(time.perf_counter() - t0)
    return size / 1e9 / median(times)


def _publisher(store: CheckpointStore, model: Any, adapter: dict[str, Any] | None) -> CheckpointPublisher:
    return CheckpointPublisher(
        store, config=model.config if model is not None else None, tokenizer=None,
        architecture="Qwen2ForCausalLM", dtype=torch.bfloat16, background=False, adapter_config=adapter,
    )  # fmt: skip


def measure_one(
    tensors: dict[str, torch.Tensor],
    root: Path,
    reps: int,
    *,
    model: Any | None = None,
    target: Any | None = None,
    adapter: dict[str, Any] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Publish, fetch and load ``tensors`` (a model's, or an adapter's with ``adapter`` = its config).

    ``target``: the model loads go into (None: the tensors are only read)."""
    store = CheckpointStore(Storage.open(str(root / "store"), "bench", "sizes"))
    name = ADAPTER_WEIGHTS_NAME if adapter is not None else WEIGHTS
    raw_dir = root / "raw"

    def raw_publish(i: int) -> None:
        (raw_dir / f"v{i}").mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(raw_dir / f"v{i}" / name), metadata={"format": "pt"})

    def ours_publish(i: int) -> None:
        assert _publisher(store, model, adapter).submit(1 + i, tensors, step=i)

    def clean_publish(_: str, i: int) -> None:
        shutil.rmtree(raw_dir / f"v{i}", ignore_errors=True)
        store.storage.delete(keys.checkpoint_dir(1 + i), recursive=True)

    pub = interleaved({"ours": ours_publish, "raw": raw_publish}, reps, teardown=clean_publish)

    # one version of each kind stays for the reads
    version = 10_000
    assert _publisher(store, model, adapter).submit(version, tensors, step=0)
    raw_publish(version)
    src = store.storage.local_path(keys.checkpoint_dir(version))

    def load_into(path: Path) -> None:
        sd = load_file(str(path))
        if target is not None:
            target.load_state_dict(sd, strict=False)  # a tied lm_head is not in the file

    ref = store.get(version)

    def ours_load(i: int) -> None:
        d = store.verified_dir(version, root / "vcache", defer_weights=True)
        if adapter is not None:  # an adapter directory's one weight file
            load_verified_safetensors(d / name, ref.files[name], ref.hash_algo, name)
        elif target is not None:  # straight into the standby model's memory: no second copy
            with torch.no_grad():
                load_verified_dir(d, ref.files, ref.hash_algo, into=target.state_dict())
        else:
            load_verified_dir(d, ref.files, ref.hash_algo)

    def ours_load_two_reads(i: int) -> None:
        load_into(store.verified_dir(version, root / "vcache") / name)

    def raw_load(i: int) -> None:
        load_into(raw_dir / f"v{version}" / name)

    def ours_fetch(i: int) -> None:
        store.fetch(version, root / f"cache-{i}")

    def raw_fetch(i: int) -> None:
        shutil.copytree(src, root / f"copy-{i}")

    def clean_fetch(_: str, i: int) -> None:
        for d in (f"cache-{i}", f"copy-{i}"):
            shutil.rmtree(root / d, ignore_errors=True)

    load = interleaved({"ours": ours_load, "ours_two_reads": ours_load_two_reads, "raw": raw_load}, reps)
    fetch = interleaved({"ours": ours_fetch, "raw": raw_fetch}, reps, teardown=clean_fetch)
    nbytes = _nbytes(tensors)
    gb = nbytes / 1e9
    h1 = hash_throughput(store.hash_algo, mib=256) / 1e3
    hall = hash_throughput(store.hash_algo, parallel=True, mib=256) / 1e3
    raw_load_s, raw_save_s = median(load["raw"]), median(pub["raw"])
    figures = {
        "publish_vs_raw": ratio(pub, "ours", "raw"),
        "fetch_vs_raw": ratio(fetch, "ours", "raw"),
        "load_vs_raw": ratio(load, "ours", "raw"),
        "load_two_reads_vs_raw": ratio(load, "ours_two_reads", "raw"),
        "hash_1core_GBps": h1,
        "hash_allcore_GBps": hall,
        "raw_read_GBps": read_GBps(raw_dir / f"v{version}" / name),
        "load_floor_vs_raw": (raw_load_s + gb / max(h1, hall)) / raw_load_s,
        "load_overlap_floor_vs_raw": max(raw_load_s, gb / max(h1, hall)) / raw_load_s,
        "publish_floor_vs_raw": (raw_save_s + gb / max(h1, hall)) / raw_save_s,
        "load_vs_raw_16core_computed": (raw_load_s + gb / (16 * h1)) / raw_load_s,
        "publish_GBps": gb / median(pub["ours"]),
        "raw_save_GBps": gb / median(pub["raw"]),
        "fetch_GBps": gb / median(fetch["ours"]),
        "load_GBps": gb / median(load["ours"]),
        "raw_load_GBps": gb / median(load["raw"]),
    }
    details = {
        "bytes": nbytes, "publish_s": pub, "fetch_s": fetch, "load_s": load, "hash": store.hash_algo,
        "ranges": {  # min..max of each variant, for the figures' spread
            f"{phase}.{v}": [round(min(ts), 3), round(max(ts), 3)]
            for phase, times in (("publish", pub), ("fetch", fetch), ("load", load))
            for v, ts in times.items()
        },
    }  # fmt: skip
    return figures, details


def measure(
    size: str, reps: int, scratch: Path, *, lora_rank: int = 0
) -> tuple[dict[str, float], dict[str, Any]]:
    """Every figure for one size (``lora_rank`` > 0: the adapter's too), keys prefixed ``{size}_``."""
    t0 = time.perf_counter()
    model = qwen2_shapes.build(size)
    target = qwen2_shapes.build(size, seed=1)  # the "fresh model" the loads go into, built once
    build_s = time.perf_counter() - t0
    aliases = tied_aliases(model)
    tensors = {k: v for k, v in model.state_dict().items() if k not in aliases}
    figures, details = measure_one(tensors, scratch / "full", reps, model=model, target=target)
    details.update(params=qwen2_shapes.param_count(model), build_s=round(build_s, 1), reps=reps)
    out = {f"{size}_{k}": v for k, v in figures.items()}
    del model, target, tensors
    if lora_rank:
        adapter = qwen2_shapes.lora_tensors(size, lora_rank)
        lf, ld = measure_one(adapter, scratch / "lora", reps, adapter=qwen2_shapes.adapter_config(lora_rank))
        out.update({f"{size}_lora{lora_rank}_{k}": v for k, v in lf.items()})
        details["lora"] = {**ld, "rank": lora_rank}
    shutil.rmtree(scratch, ignore_errors=True)  # gigabytes: never left behind
    return out, details
