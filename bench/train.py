"""Trainer benchmark: the full Trainer's throughput against a plain PyTorch loop on the same batches.

Run:  .venv/bin/python -m bench.train            (about 1-2 minutes on 2 cores)
      .venv/bin/python -m bench.train --quick    (fewer steps and repetitions, smoke run)

Prints `name value` lines and writes bench/results/train.json (raw numbers in train_details.json):

- train_vs_plain_torch: trainer tokens/s / plain tokens/s (target >= 0.9). The trainer does a whole
  step as configured by default (reader take from committed shards, padding, FFD plan, proximal-logp
  forward, advantages, decoupled PPO forward/backward, grad clip, AdamW, consumed log, a checkpoint
  published every version with the upload in a background thread, a resume point every 10 steps);
  its time is the sum of step_time_s. The plain loop does the same forward passes on the same padded
  batches (a no-grad forward for the proximal logprobs, then forward + log-softmax gather + a PPO
  surrogate + backward + clip_grad_norm_ + AdamW) and nothing else.
- train_compute_vs_plain_torch: the same with the trainer's compute time only (no publish / resume).
- trainer_tokens_per_s, plain_tokens_per_s, peak_rss_mb (trainer process), plain_peak_rss_mb.

Each side runs in its own process (so peak RSS is per side), alternating, `--reps` times; the figure
uses medians. The first `WARMUP` steps of each run are not timed. Model: the embedded-default size
(Llama, hidden 128, 4 layers, vocab 40, 0.8M params); batch: 8 groups x 8 samples x 64 tokens.

This is a script, not a test: it asserts nothing about targets; it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import median, report

WARMUP = 2
GROUPS, GROUP_SIZE, PROMPT, COMPLETION = 8, 8, 33, 31
VOCAB = ["<|pad|>", "<|unk|>", "<|im_start|>", "<|im_end|>"] + list("0123456789+-*=?abcdefghijklmnopqrst ")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_model(path: Path) -> None:
    """A random Llama of the embedded default's size + a character tokenizer (no hub)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token="<|unk|>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>").save_pretrained(
        path
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)


def write_shards(storage: Any, n_groups: int, seed: int = 0) -> None:
    from storage.schema import TrajectoryGroup, TrajectoryRow
    from storage.shards import ShardWriter

    rng = random.Random(seed)
    w = ShardWriter(storage, "bench", flush_rows=GROUPS * GROUP_SIZE, flush_seconds=3600.0)
    for g in range(n_groups):
        prompt = [rng.randrange(4, len(VOCAB)) for _ in range(PROMPT)]
        rows = []
        for i in range(GROUP_SIZE):
            ids = prompt + [rng.randrange(4, len(VOCAB)) for _ in range(COMPLETION)]
            mask = [0] * PROMPT + [1] * COMPLETION
            lp = [0.0] * PROMPT + [-3.7 + rng.uniform(-0.2, 0.2) for _ in range(COMPLETION)]
            rows.append(
                TrajectoryRow.build(
                    traj_id=f"g{g}-{i}",
                    group_id=f"g{g}",
                    prompt_id=f"p{g}",
                    input_ids=ids,
                    loss_mask=mask,
                    logprobs=lp,
                    versions=[-1] * PROMPT + [0] * COMPLETION,
                    reward=float(rng.random() < 0.5),
                    finish_reason="stop",
                )
            )
        w.add(TrajectoryGroup(f"g{g}", f"p{g}", rows))
    w.close()


def _cfg(workdir: Path, trial: str, steps: int, threads: int) -> Any:
    from rollflow.api.config_loader import load_config

    return load_config(
        data={
            "experiment": "bench",
            "trial": trial,
            "storage": {"root": str(workdir / "store")},
            "model": {"path": str(workdir / "model")},
            "rollout": {"max_staleness": 10_000, "group_size": GROUP_SIZE},
            "train": {"steps": steps, "batch_size": GROUPS, "lr": 1e-4, "threads": threads},
        }
    )


def phase_trainer(workdir: Path, trial: str, steps: int, threads: int) -> dict[str, float]:
    from rollflow.api.metrics import InMemorySink
    from rollflow.training.trainer import Trainer
    from storage.fs import Storage

    cfg = _cfg(workdir, trial, steps, threads)
    storage = Storage.open(cfg.storage.root, cfg.experiment, cfg.trial)
    sink = InMemorySink()
    Trainer(cfg, storage, metrics=sink).run()
    tokens = sink.values("tokens")[WARMUP:]
    return {
        "tokens": sum(tokens),
        "step_s": sum(sink.values("step_time_s")[WARMUP:]),
        "compute_s": sum(sink.values("compute_time_s")[WARMUP:]),
        "peak_rss_mb": _peak_rss_mb(),
    }


def phase_plain(workdir: Path, trial: str, steps: int, threads: int) -> dict[str, float]:
    """Same batches, same forwards, nothing but PyTorch."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollflow.training.batching import build_batch
    from storage.fs import Storage
    from storage.shards import ShardReader

    torch.set_num_threads(threads)
    cfg = _cfg(workdir, trial, steps, threads)
    reader = ShardReader(Storage.open(cfg.storage.root, cfg.experiment, cfg.trial))
    batches = [build_batch(reader.take(GROUPS).groups) for _ in range(steps)]  # untimed data prep
    model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, seconds = 0.0, 0.0
    for i, b in enumerate(batches):
        t0 = time.perf_counter()
        ids, mask = b.input_ids, b.loss_mask
        rewards = b.rewards.view(GROUPS, GROUP_SIZE)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        with torch.no_grad():
            z = model(input_ids=ids, use_cache=False).logits[:, :-1]
            prox = z.gather(-1, ids[:, 1:, None]).squeeze(-1) - z.logsumexp(-1)
        z = model(input_ids=ids, use_cache=False).logits[:, :-1]
        logp = z.gather(-1, ids[:, 1:, None]).squeeze(-1) - z.logsumexp(-1)
        ratio = torch.exp(logp - prox)
        m = mask[:, 1:]
        loss = (torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= WARMUP:
            seconds += time.perf_counter() - t0
            tokens += float(b.attention_mask.sum())
    return {"tokens": tokens, "step_s": seconds, "compute_s": seconds, "peak_rss_mb": _peak_rss_mb()}


def _run_phase(phase: str, workdir: Path, trial: str, steps: int, threads: int) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "bench.train",
        "--phase",
        phase,
        "--workdir",
        str(workdir),
        "--trial",
        trial,
        "--steps",
        str(steps),
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--phase", choices=["trainer", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:  # child process
        fn = phase_trainer if args.phase == "trainer" else phase_plain
        print(json.dumps(fn(Path(args.workdir), args.trial, args.steps, args.threads)), flush=True)
        return 0

    from storage.fs import Storage

    reps, steps = (1, 5) if args.quick else (args.reps, args.steps)
    results: dict[str, list[dict[str, float]]] = {"trainer": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="rollflow-bench-train-") as tmp:
        workdir = Path(tmp)
        build_model(workdir / "model")
        for i in range(reps):
            order = ["plain", "trainer"] if i % 2 == 0 else ["trainer", "plain"]
            for phase in order:
                trial = f"{phase}-{i}"
                write_shards(Storage.open(str(workdir / "store"), "bench", trial), GROUPS * steps, seed=i)
                results[phase].append(_run_phase(phase, workdir, trial, steps, args.threads))

    def tps(r: dict[str, float], key: str) -> float:
        return r["tokens"] / r[key]

    trainer_tps = median([tps(r, "step_s") for r in results["trainer"]])
    trainer_compute_tps = median([tps(r, "compute_s") for r in results["trainer"]])
    plain_tps = median([tps(r, "step_s") for r in results["plain"]])
    figures = {
        "train_vs_plain_torch": trainer_tps / plain_tps,
        "train_compute_vs_plain_torch": trainer_compute_tps / plain_tps,
        "trainer_tokens_per_s": trainer_tps,
        "plain_tokens_per_s": plain_tps,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results["trainer"]),
        "plain_peak_rss_mb": max(r["peak_rss_mb"] for r in results["plain"]),
    }
    details = {
        "runs": results,
        "steps_per_run": steps,
        "timed_steps_per_run": steps - WARMUP,
        "batch": {"groups": GROUPS, "group_size": GROUP_SIZE, "tokens_per_seq": PROMPT + COMPLETION},
        "threads": args.threads,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    report("train", figures, details)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
