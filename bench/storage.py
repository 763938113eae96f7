"""Storage benchmark: what the commit protocols cost over the plain pyarrow / save_pretrained path.

Run:  .venv/bin/python -m bench.storage            (about 2-3 minutes on 2 cores)
      .venv/bin/python -m bench.storage --quick    (fewer repetitions, smoke run)
      .venv/bin/python -m bench.storage --delta    (+ the delta-checkpoint figures, about 3 more minutes)
      .venv/bin/python -m bench.storage --delta-only   (those alone: bench/results/storage_delta.json)
      .venv/bin/python -m bench.storage --size 1.5b --lora   (real sizes: bench/storage_sizes.py says how;
                                                              bench/results/storage_<size>.json)

Prints one `name value` line per figure and writes them to bench/results/storage.json (raw timings in
storage_details.json). Every figure is median(ours) / median(raw) over interleaved repetitions, both
sides doing the same work to the same place (same directory / same bucket):

- shard_write_vs_raw: ShardWriter.add (x32 groups) + flush, i.e. groups -> table with validation, Parquet
  encode, sha256, one put, exclusive commit record; vs groups_to_table + pyarrow.parquet.write_table.
- shard_read_vs_raw: ShardReader.take of one new commit (list, record, get, sha256, decode, validate,
  table -> groups); vs pyarrow.parquet.read_table + table_to_groups.
- ckpt_publish_vs_raw: the trainer's publish path, `CheckpointPublisher.submit` (write_hf_dir into
  CheckpointStore.staging_dir, each safetensors file hashed (blake3) from the buffers as they are
  written, then publish with those digests: COMMIT.json, LATEST); vs save_pretrained straight into the
  destination. On S3: the publisher writes (hashing) to a temp dir and publish uploads it (hashing on
  the way) vs save_pretrained + s3fs `put` of the dir.
- ckpt_fetch_vs_raw: fetch (a private copy + blake3 verification of every file into the cache) vs a
  plain copy (local: shutil.copytree; S3: s3fs `get` of the dir).
- `*_s3`: the same against a moto S3 server this script starts on 127.0.0.1.

Extra figures (same method): shard_{write,read}_vs_raw_io compare against pyarrow I/O alone (the raw
side skips the groups <-> table conversion that ShardWriter/Reader must do);
ckpt_publish_saved_dir_vs_raw is save_pretrained into the staging dir + publish without digests (the
files are read back to hash them: what a caller that did not hash while writing pays);
ckpt_publish_copy_vs_raw publishes a save_pretrained dir from elsewhere (a full hashed copy);
ckpt_verified_dir_vs_raw is `verified_dir`, what the watcher does before every load (local: blake3 of
every file in place, no copy; S3: the same as fetch) over the same plain copy.
Details also hold the hash throughput of both algorithms on this machine (`hash_MBps`).

Delta checkpoints (`--delta`, issue 20 section 5; `bench/storage_delta.py` says how): the tiny model of
configs/tiny_cpu.yaml trained `--delta-steps` steps by the real trainer, every version published, in
float32 and in bfloat16, at the configured lr and at lr / 10 (keys suffixed `_lr_div10`). Medians over
the consecutive version pairs: delta_changed_fraction_{fp32,bf16} (elements whose bytes changed) and
storage_bytes_per_version_ratio_{fp32,bf16} (bytes of the smallest of three delta encodings / bytes of
the full version); storage_bytes_per_version_ratio is the bf16 one at the configured lr. With `--quick`
the delta part is a smoke run (3 steps of 4 groups, the untrained model). Spreads and every pair are in the
details.

This is a script, not a test: it asserts nothing about targets; it reports.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench._common import hash_throughput, interleaved, median, moto_server, ratio, report
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow, groups_to_table, table_to_groups
from storage.shard_reader import ShardReader
from storage.shard_writer import ShardWriter

N_GROUPS, ROWS_PER_GROUP, PROMPT_LEN, GEN_LEN = 32, 8, 128, 384  # 256 rows x 512 tokens = 131k tokens


def make_groups(seed: int) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    groups = []
    for g in range(N_GROUPS):
        head = rng.randrange(0, 4)
        rows = []
        for r in range(ROWS_PER_GROUP):
            versions = [-1] * PROMPT_LEN + [head + (t * 2 // GEN_LEN) for t in range(GEN_LEN)]
            rows.append(
                TrajectoryRow.build(
                    traj_id=f"s{seed}-g{g}-r{r}",
                    group_id=f"s{seed}-g{g}",
                    prompt_id=f"p{g}",
                    input_ids=[rng.randrange(32000) for _ in range(PROMPT_LEN + GEN_LEN)],
                    loss_mask=[0] * PROMPT_LEN + [1] * GEN_LEN,
                    logprobs=[0.0] * PROMPT_LEN + [-rng.random() * 3 for _ in range(GEN_LEN)],
                    versions=versions,
                    reward=float(rng.random() < 0.5),
                    finish_reason="stop",
                )
            )
        groups.append(TrajectoryGroup(f"s{seed}-g{g}", f"p{g}", rows))
    return groups


# --- shards -----------------------------------------------------------------------------------------------


def bench_shards(storage: Storage, reps: int) -> tuple[dict[str, float], dict[str, Any]]:
    datasets = [make_groups(i) for i in range(4)]
    tables = [groups_to_table(d) for d in datasets]
    reader = ShardReader(storage)  # one long-lived reader, like the trainer's

    def raw_path(i: int, kind: str) -> str:
        return f"{storage.base}/{keys.SHARD_DIR}/raw-{kind}-{i:04d}.parquet"

    def write_table(table, path: str) -> None:
        if storage.is_local:
            pq.write_table(table, path)
        else:
            pq.write_table(table, path, filesystem=storage.fs)

    def read_table(path: str):
        return pq.read_table(path) if storage.is_local else pq.read_table(path, filesystem=storage.fs)

    if storage.is_local:
        os.makedirs(f"{storage.base}/{keys.SHARD_DIR}", exist_ok=True)

    def ours_write(i: int) -> None:
        w = ShardWriter(storage, "bench", flush_rows=10**9)
        for g in datasets[i % 4]:
            w.add(g)
        w.flush()

    def raw_write(i: int) -> None:
        write_table(groups_to_table(datasets[i % 4]), raw_path(i, "g"))

    def raw_write_io(i: int) -> None:
        write_table(tables[i % 4], raw_path(i, "t"))

    def ours_read(i: int) -> None:
        res = reader.take(N_GROUPS)
        assert len(res.groups) == N_GROUPS, len(res.groups)

    def raw_read(i: int) -> None:
        groups = table_to_groups(read_table(raw_path(i, "g")))
        assert len(groups) == N_GROUPS

    def raw_read_io(i: int) -> None:
        assert read_table(raw_path(i, "t")).num_rows == N_GROUPS * ROWS_PER_GROUP

    w = interleaved({"ours": ours_write, "raw": raw_write, "raw_io": raw_write_io}, reps)
    r = interleaved({"ours": ours_read, "raw": raw_read, "raw_io": raw_read_io}, reps)
    figures = {
        "write_vs_raw": ratio(w, "ours", "raw"),
        "read_vs_raw": ratio(r, "ours", "raw"),
        "write_vs_raw_io": ratio(w, "ours", "raw_io"),
        "read_vs_raw_io": ratio(r, "ours", "raw_io"),
    }
    size = storage.size(reader.list_commits(include_consumed=True)[0].shard_key)
    details = {"write_s": w, "read_s": r, "shard_bytes": size, "rows": N_GROUPS * ROWS_PER_GROUP}
    return figures, details


# --- checkpoints ------------------------------------------------------------------------------------------


def build_model() -> Any:
    from rollflow.models.random_llama import random_llama

    return random_llama(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
        num_key_value_heads=12, max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_checkpoints(
    storage: Storage, model: Any, reps: int, scratch: Path
) -> tuple[dict[str, float], dict]:
    store = CheckpointStore(storage)
    local = storage.is_local
    fns: dict[str, Any] = {}

    def staging(i: int) -> Path:
        return scratch / f"staging-{i}"

    # publish ------------------------------------------------------------------
    def raw_publish(i: int) -> None:
        if local:
            model.save_pretrained(storage.local_path(f"raw/v{i:06d}"))
        else:
            model.save_pretrained(staging(i))
            storage.fs.put(str(staging(i)), f"{storage.base}/raw/v{i:06d}", recursive=True)

    from rollflow.training.publish import CheckpointPublisher

    state_dict = model.state_dict()

    def ours_publish(i: int) -> None:
        pub = CheckpointPublisher(
            store,
            config=model.config,
            tokenizer=None,
            generation_config=model.generation_config,
            architecture="LlamaForCausalLM",
            background=False,
        )
        assert pub.submit(1 + i, state_dict, step=i)

    def ours_publish_saved_dir(i: int) -> None:
        target = store.staging_dir(2000 + i) or staging(i)
        model.save_pretrained(target)
        store.publish(target, 2000 + i)

    fns = {"ours": ours_publish, "raw": raw_publish}
    if local:

        def ours_publish_copy(i: int) -> None:
            model.save_pretrained(staging(i))
            store.publish(staging(i), 1000 + i)

        fns["ours_saved_dir"] = ours_publish_saved_dir
        fns["ours_copy"] = ours_publish_copy

    def cleanup(name: str, i: int) -> None:
        shutil.rmtree(staging(i), ignore_errors=True)
        storage.delete(f"raw/v{i:06d}", recursive=True)
        for v in (1 + i, 1000 + i, 2000 + i):
            storage.delete(keys.checkpoint_dir(v), recursive=True)
        storage.delete(keys.LATEST_KEY)

    pub = interleaved(fns, reps, teardown=cleanup)

    # fetch --------------------------------------------------------------------
    model.save_pretrained(staging(0))
    ref = store.publish(staging(0), 5000)
    shutil.rmtree(staging(0))
    nbytes = sum(f["size"] for f in ref.files.values())
    src_key = keys.checkpoint_dir(5000)

    def raw_fetch(i: int) -> None:
        dst = scratch / f"raw-fetch-{i}"
        if local:
            shutil.copytree(storage.local_path(src_key), dst)
        else:
            storage.fs.get(f"{storage.base}/{src_key}/", str(dst) + "/", recursive=True)

    def ours_fetch(i: int) -> None:
        store.fetch(5000, scratch / f"cache-{i}")

    def ours_verified_dir(i: int) -> None:
        store.verified_dir(5000, scratch / f"vcache-{i}")

    def cleanup_fetch(name: str, i: int) -> None:
        for d in (f"raw-fetch-{i}", f"cache-{i}", f"vcache-{i}"):
            shutil.rmtree(scratch / d, ignore_errors=True)

    fet = interleaved(
        {"ours": ours_fetch, "raw": raw_fetch, "ours_verified_dir": ours_verified_dir},
        reps,
        teardown=cleanup_fetch,
    )
    storage.delete(src_key, recursive=True)

    figures = {
        "publish_vs_raw": ratio(pub, "ours", "raw"),
        "fetch_vs_raw": ratio(fet, "ours", "raw"),
        "verified_dir_vs_raw": ratio(fet, "ours_verified_dir", "raw"),
    }
    if local:
        figures["publish_copy_vs_raw"] = ratio(pub, "ours_copy", "raw")
        figures["publish_saved_dir_vs_raw"] = ratio(pub, "ours_saved_dir", "raw")
    return figures, {
        "publish_s": pub,
        "fetch_s": fet,
        "checkpoint_bytes": nbytes,
        "files": sorted(ref.files),
        "hash": ref.hash_algo,
    }


def bench_deltas(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, float], dict[str, Any]]:
    import torch

    from bench.storage_delta import DeltaSettings, measure

    settings = (
        DeltaSettings(steps=3, groups=4, warm_start_steps=0)
        if args.quick
        else DeltaSettings(steps=args.delta_steps)
    )
    model = Path(args.delta_model).resolve() if args.delta_model else None
    torch.set_num_threads(1)  # the trainer runs one thread (train.threads); so do the behaviour logprobs
    t0 = time.perf_counter()
    figures, details = measure(scratch, settings, model_dir=model)
    details["wall_s"] = round(time.perf_counter() - t0, 1)
    return figures, details


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--delta", action="store_true", help="also measure delta checkpoints (a few minutes)")
    ap.add_argument("--delta-only", action="store_true", help="the delta part alone (storage_delta.json)")
    ap.add_argument("--delta-steps", type=int, default=30, help="trainer steps per delta run (default 30)")
    model_help = "a built tiny model dir (e.g. runs/models/tiny) instead of building one (~40 s)"
    ap.add_argument("--delta-model", default=None, help=model_help)
    ap.add_argument(
        "--size", choices=["tiny", "0.5b", "1.5b"], default=None, help="a Qwen2-shaped model instead"
    )
    ap.add_argument("--lora", action="store_true", help="--size: also a rank-64 adapter on that shape")
    ap.add_argument("--reps", type=int, default=3, help="--size: repetitions per variant (median reported)")
    ap.add_argument("--dir", default=None, help="--size: where the files go (default: the temp dir)")
    args = ap.parse_args(argv)
    if args.size:
        return main_sizes(args)
    if args.delta_steps < 2:
        ap.error("--delta-steps must be >= 2 (the figures are medians over consecutive version pairs)")
    shard_reps, ckpt_reps, ckpt_reps_s3 = (3, 2, 1) if args.quick else (15, 5, 3)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.delta_only:
        with tempfile.TemporaryDirectory(prefix="rollflow-bench-delta-") as tmp:
            figures, details = bench_deltas(args, Path(tmp))
        out = report("storage_delta", figures, details)
        print(f"# wrote {out} in {details['wall_s']} s", flush=True)
        return
    t_start = time.perf_counter()
    figures_d: dict[str, float] = {}
    model = build_model()
    n_params = sum(p.numel() for p in model.parameters())
    figures: dict[str, float] = {}
    details: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "hash_MBps": {a: round(hash_throughput(a)) for a in ("sha256", "blake3")},
        "model_params": n_params,
        "shard_reps": shard_reps,
        "ckpt_reps": ckpt_reps,
        "ckpt_reps_s3": ckpt_reps_s3,
    }
    with tempfile.TemporaryDirectory(prefix="rollflow-bench-") as tmp:
        tmp_path = Path(tmp)
        local = Storage.open(str(tmp_path / "store"), "bench", "local")
        with moto_server() as opts:
            s3 = Storage.open("s3://rollflow-bench/runs", "bench", "s3", opts)
            s3.ensure_bucket()
            for suffix, st in (("", local), ("_s3", s3)):
                f, d = bench_shards(st, shard_reps)
                details[f"shards{suffix}"] = d
                sc = tmp_path / f"scratch{suffix}"
                sc.mkdir()
                cf, cd = bench_checkpoints(st, model, ckpt_reps_s3 if suffix else ckpt_reps, sc)
                details[f"ckpt{suffix}"] = cd
                for k in ("write_vs_raw", "read_vs_raw"):
                    figures[f"shard_{k}{suffix}"] = f[k]
                for k in ("publish_vs_raw", "fetch_vs_raw"):
                    figures[f"ckpt_{k}{suffix}"] = cf[k]
                for k in ("write_vs_raw_io", "read_vs_raw_io"):
                    details.setdefault("extra_figures", {})[f"shard_{k}{suffix}"] = f[k]
                extra = details.setdefault("extra_figures", {})
                extra[f"ckpt_verified_dir_vs_raw{suffix}"] = cf["verified_dir_vs_raw"]
                for k in ("publish_copy_vs_raw", "publish_saved_dir_vs_raw"):
                    if k in cf:
                        extra[f"ckpt_{k}"] = cf[k]
        if args.delta:
            figures_d, details["delta"] = bench_deltas(args, tmp_path / "delta")
    extras = details.pop("extra_figures", {})
    figures.update(extras)
    if args.delta:
        figures.update(figures_d)
    details["medians_s"] = {
        f"{section}.{phase}.{variant}": round(median(ts), 4)
        for section in ("shards", "shards_s3", "ckpt", "ckpt_s3")
        for phase, by_variant in details[section].items()
        if isinstance(by_variant, dict)
        for variant, ts in by_variant.items()
    }
    details["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = report("storage", figures, details)
    print(f"# wrote {out} in {details['wall_s']} s", flush=True)


def main_sizes(args: argparse.Namespace) -> None:
    """``--size``: publish / fetch / load of a real-size model against plain safetensors (storage_sizes)."""
    import torch

    from bench.storage_sizes import measure

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="rollflow-bench-size-", dir=args.dir) as tmp:
        free_gb = shutil.disk_usage(tmp).free / 1e9
        figures, details = measure(args.size, args.reps, Path(tmp) / "s", lora_rank=64 if args.lora else 0)
    details["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "free_disk_GB": round(free_gb),
    }
    out = report(f"storage_{args.size}", figures, details)
    print(f"# wrote {out}", flush=True)


if __name__ == "__main__":
    main()
