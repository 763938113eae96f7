"""Trainer benchmark: the full Trainer's throughput against a plain PyTorch loop on the same batches.

Run:  .venv/bin/python -m bench.train            (about 2-4 minutes on 2 cores)
      .venv/bin/python -m bench.train --lora-only --reps 3   (LoRA against full only: bench/results/train_lora.json)
      .venv/bin/python -m bench.train --quick    (fewer steps, smoke run)

Prints `name value` lines and writes bench/results/train.json (raw per-step numbers in
train_details.json):

- train_vs_plain_torch: trainer tokens/s / plain tokens/s (target >= 0.9). The trainer's time per step
  is its whole step as configured by default: the reader's take from committed shards (sha256, Parquet
  decode, validation), padding, FFD plan, proximal-logp forward, advantages, decoupled PPO
  forward/backward, grad clip, AdamW, the consumed log, a checkpoint published every version (upload in
  a background thread) and a resume point every 10 steps. The plain loop does the same forward passes on
  the same padded batches (a no-grad forward for the proximal logprobs, then forward + log-softmax
  gather + a PPO surrogate + backward + clip_grad_norm_ + AdamW) and nothing else; its data prep is not
  timed.
- train_compute_vs_plain_torch: the same with the trainer's compute part only (no data, publish, resume).
- train_vs_plain_torch_total: total plain time / total trainer time (the headline is the median of
  per-step-pair ratios, which one burst of load from another process cannot swing).
- train_vs_plain_torch_cpu: the median pair ratio in process CPU time instead of wall time (what each
  side costs, whatever else runs on the machine).
- trainer_tokens_per_s, plain_tokens_per_s; peak_rss_mb of a trainer-only process, plain_peak_rss_mb.
- LoRA against full fine-tuning on the same model and batches (``train.lora.rank = --lora-rank``, every
  linear layer of the blocks), each side in its own trainer-only process, ``--reps`` times, alternating:
  lora_train_step_s and full_train_step_s (median step_time_s after warmup, median over reps; the
  per-rep values are in the details), lora_train_step_vs_full; lora_peak_rss_mb and full_peak_rss_mb;
  lora_checkpoint_bytes_ratio = bytes of one published LoRA version (adapter_model.safetensors +
  adapter_config.json) / bytes of one full version (from COMMIT.json).
- delta_changed_frac_fp32 / delta_changed_frac_bf16: the fraction of weight elements that differ between
  consecutive published full versions (the last three the full trainer kept), as float32 and as the
  bfloat16 a model.dtype=bfloat16 run publishes (the same fp32 masters rounded); a sparse delta would
  move that fraction x (element size + a 4-byte index) per version (issue 20, section 5).

Method: this machine is shared, so the two sides are paired step by step in one process. The plain loop
runs as the trainer's TrainerHooks, one plain step per trainer step on the same batch, alternately just
before and just after it; both sides see the same load. The trainer is clocked from outside: all time
outside the hooks is its own, plus any background upload still running when a hook starts. The first WARMUP steps are not counted. Peak RSS
comes from separate trainer-only and plain-only processes. Model: the embedded-default size (Llama,
hidden 128, 4 layers, vocab 40, 0.8M params); batch: 8 groups x 8 samples x 64 tokens.

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
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import median, report
from rollflow.trial.store import open_trial_storage

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
    from storage.shard_writer import ShardWriter

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


def _cfg(workdir: Path, trial: str, steps: int, threads: int, lora_rank: int = 0) -> Any:
    from rollflow.configuration.loader import load_config

    return load_config(
        data={
            "experiment": "bench",
            "trial": trial,
            "storage": {"root": str(workdir / "store")},
            "model": {"path": str(workdir / "model")},
            "rollout": {"max_staleness": 10_000, "group_size": GROUP_SIZE},
            "train": {
                "steps": steps,
                "batch_size": GROUPS,
                "lr": 1e-4,
                "threads": threads,
                "lora": {"rank": lora_rank},
            },
        }
    )


def phase_trainer(
    workdir: Path, trial: str, steps: int, threads: int, hooks: Any = None, lora_rank: int = 0
) -> dict[str, Any]:
    from rollflow.api.metrics import InMemorySink
    from rollflow.training.trainer import Trainer
    from storage import keys

    cfg = _cfg(workdir, trial, steps, threads, lora_rank)
    storage = open_trial_storage(cfg)
    sink = InMemorySink()
    Trainer(cfg, storage, metrics=sink, hooks=hooks).run()
    commit = storage.get_json(keys.checkpoint_commit_key(steps))
    delta = changed_fractions(storage, [steps - 2, steps - 1, steps]) if lora_rank == 0 else {}
    return {
        **delta,
        "tokens": sink.values("tokens"),
        "step_s": sink.values("step_time_s"),
        "compute_s": sink.values("compute_time_s"),
        "peak_rss_mb": _peak_rss_mb(),
        "checkpoint_bytes": sum(f["size"] for f in commit["files"].values()),
    }


def changed_fractions(storage: Any, versions: list[int]) -> dict[str, float]:
    """Mean fraction of elements that change between consecutive versions, in fp32 and in bf16."""
    import torch
    from safetensors.torch import load_file

    from storage import keys

    sds = [load_file(str(storage.local_path(keys.checkpoint_dir(v)) / "model.safetensors")) for v in versions]
    out: dict[str, list[float]] = {"delta_changed_frac_fp32": [], "delta_changed_frac_bf16": []}
    for a, b in zip(sds, sds[1:], strict=False):
        for key, dtype in (
            ("delta_changed_frac_fp32", torch.float32),
            ("delta_changed_frac_bf16", torch.bfloat16),
        ):
            changed = sum(int((a[n].to(dtype) != b[n].to(dtype)).sum()) for n in a)
            out[key].append(changed / sum(t.numel() for t in a.values()))
    return {k: sum(v) / len(v) for k, v in out.items()}


def phase_lora(workdir: Path, trial: str, steps: int, threads: int, lora_rank: int = 8) -> dict[str, Any]:
    return phase_trainer(workdir, trial, steps, threads, lora_rank=lora_rank)


class PlainLoop:
    """The same forwards on the same padded batches, in plain PyTorch, one step per call.

    Used as the trainer's TrainerHooks it also clocks the trainer: everything outside the hooks (the
    trainer's take, compute, consumed log, publish, resume point) is charged to the trainer step it
    belongs to, in wall time and in process CPU time.
    """

    def __init__(self, workdir: Path, trial: str, steps: int, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from rollflow.training.batching import build_batch
        from storage.shard_reader import ShardReader

        torch.set_num_threads(threads)
        cfg = _cfg(workdir, trial, steps, threads)
        reader = ShardReader(open_trial_storage(cfg))
        self.batches = [build_batch(reader.take(GROUPS).groups) for _ in range(steps)]  # untimed data prep
        self.model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.wall: dict[int, float] = {}  # plain step i
        self.cpu: dict[int, float] = {}
        self.trainer_wall: dict[int, float] = {}  # trainer step i, clocked from outside
        self.trainer_cpu: dict[int, float] = {}
        self._mark: tuple[float, float] | None = None
        self._acc = [0.0, 0.0]

    def step(self, i: int) -> None:
        import torch

        t0, c0 = time.perf_counter(), time.process_time()
        b = self.batches[i]
        ids, mask = b.input_ids, b.loss_mask
        rewards = b.rewards.view(GROUPS, GROUP_SIZE)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        with torch.no_grad():
            z = self.model(input_ids=ids, use_cache=False).logits[:, :-1]
            prox = z.gather(-1, ids[:, 1:, None]).squeeze(-1) - z.logsumexp(-1)
        z = self.model(input_ids=ids, use_cache=False).logits[:, :-1]
        logp = z.gather(-1, ids[:, 1:, None]).squeeze(-1) - z.logsumexp(-1)
        ratio = torch.exp(logp - prox)
        m = mask[:, 1:]
        loss = (torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.wall[i] = time.perf_counter() - t0
        self.cpu[i] = time.process_time() - c0

    # --- TrainerHooks: one plain step per trainer step on the same batch, alternately just before and
    # just after it, so both sides see the same machine load and neither always runs cache-warm.

    def _pause_trainer(self) -> None:
        """Hook entry: charge the time since the trainer got control back, then finish its background
        upload (also charged to it: conservative, as in a real run that overlaps its next step)."""
        for t in threading.enumerate():
            if t.name.startswith("publish-v"):
                t.join()
        if self._mark is not None:
            self._acc[0] += time.perf_counter() - self._mark[0]
            self._acc[1] += time.process_time() - self._mark[1]

    def _resume_trainer(self) -> None:
        self._mark = (time.perf_counter(), time.process_time())

    def before_step(self, version: int) -> None:
        self._pause_trainer()
        if version % 2 == 1:
            self.step(version)
        self._resume_trainer()

    def after_step(self, version: int) -> None:
        self._pause_trainer()
        i = version - 1
        self.trainer_wall[i], self.trainer_cpu[i] = self._acc
        self._acc = [0.0, 0.0]
        if i % 2 == 0:
            self.step(i)
        self._resume_trainer()


def phase_plain(workdir: Path, trial: str, steps: int, threads: int) -> dict[str, Any]:
    loop = PlainLoop(workdir, trial, steps, threads)
    for i in range(steps):
        loop.step(i)
    return {
        "tokens": [float(b.attention_mask.sum()) for b in loop.batches],
        "step_s": [loop.wall[i] for i in range(steps)],
        "peak_rss_mb": _peak_rss_mb(),
    }


def phase_paired(workdir: Path, trial: str, steps: int, threads: int) -> dict[str, Any]:
    plain = PlainLoop(workdir, trial + "-copy", steps, threads)
    out = phase_trainer(workdir, trial, steps, threads, hooks=plain)
    out["plain_s"] = [plain.wall[i] for i in range(steps)]
    out["plain_cpu_s"] = [plain.cpu[i] for i in range(steps)]
    out["trainer_s"] = [plain.trainer_wall[i] for i in range(steps)]
    out["trainer_cpu_s"] = [plain.trainer_cpu[i] for i in range(steps)]
    out["plain_tokens"] = [float(b.attention_mask.sum()) for b in plain.batches]
    return out


def _run_phase(
    phase: str, workdir: Path, trial: str, steps: int, threads: int, lora_rank: int = 8
) -> dict[str, Any]:
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
        "--lora-rank",
        str(lora_rank),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def lora_figures(full: list[dict[str, Any]], lora: list[dict[str, Any]]) -> dict[str, float]:
    """LoRA against full fine-tuning: per-rep median step times (after warmup), median over reps."""
    full_s = [median(r["step_s"][WARMUP:]) for r in full]
    lora_s = [median(r["step_s"][WARMUP:]) for r in lora]
    return {
        "lora_train_step_s": median(lora_s),
        "full_train_step_s": median(full_s),
        "lora_train_step_vs_full": median(lora_s) / median(full_s),
        "lora_train_step_s_min": min(lora_s),
        "lora_train_step_s_max": max(lora_s),
        "full_train_step_s_min": min(full_s),
        "full_train_step_s_max": max(full_s),
        "lora_peak_rss_mb": median([r["peak_rss_mb"] for r in lora]),
        "full_peak_rss_mb": median([r["peak_rss_mb"] for r in full]),
        "lora_checkpoint_bytes": float(lora[0]["checkpoint_bytes"]),
        "full_checkpoint_bytes": float(full[0]["checkpoint_bytes"]),
        "lora_checkpoint_bytes_ratio": lora[0]["checkpoint_bytes"] / full[0]["checkpoint_bytes"],
        "delta_changed_frac_fp32": median([r["delta_changed_frac_fp32"] for r in full]),
        "delta_changed_frac_bf16": median([r["delta_changed_frac_bf16"] for r in full]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=8, help="train.lora.rank of the LoRA side")
    ap.add_argument("--lora-only", action="store_true", help="only LoRA against full fine-tuning")
    ap.add_argument("--phase", choices=["paired", "trainer", "plain", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:  # child process
        workdir = Path(args.workdir)
        if args.phase == "lora":
            out = phase_lora(workdir, args.trial, args.steps, args.threads, args.lora_rank)
        else:
            fn = {"paired": phase_paired, "trainer": phase_trainer, "plain": phase_plain}[args.phase]
            out = fn(workdir, args.trial, args.steps, args.threads)
        print(json.dumps(out), flush=True)
        return 0

    from storage.fs import Storage

    reps, steps = (1, 5) if args.quick else (args.reps, args.steps)
    runs: dict[str, list[dict[str, Any]]] = {"paired": [], "trainer": [], "plain": [], "lora": []}
    with tempfile.TemporaryDirectory(prefix="rollflow-bench-train-") as tmp:
        workdir = Path(tmp)
        build_model(workdir / "model")
        plan = [] if args.lora_only else [("paired", i) for i in range(reps)] + [("plain", 0)]
        plan += [
            (p, i) for i in range(reps) for p in (("trainer", "lora") if i % 2 == 0 else ("lora", "trainer"))
        ]
        for phase, i in plan:
            trial = f"{phase}-{i}"
            for t in (trial, trial + "-copy") if phase == "paired" else (trial,):
                write_shards(Storage.open(str(workdir / "store"), "bench", t), GROUPS * steps, seed=i)
            runs[phase].append(_run_phase(phase, workdir, trial, steps, args.threads, args.lora_rank))

    details = {
        "runs": runs,
        "steps_per_run": steps,
        "timed_steps_per_run": steps - WARMUP,
        "batch": {"groups": GROUPS, "group_size": GROUP_SIZE, "tokens_per_seq": PROMPT + COMPLETION},
        "threads": args.threads,
        "lora_rank": args.lora_rank,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_after": os.getloadavg(),
        },
    }
    if args.lora_only:
        report("train_lora", lora_figures(runs["trainer"], runs["lora"]), details)
        return 0
    # Per-step pairs after warmup: same batch, same moment, same process. The headline ratio is the
    # median over pairs of plain_time / trainer_time (robust to load bursts from other processes);
    # the CPU-time variant is insensitive to other processes altogether; *_tokens_per_s are totals.
    ratios, cpu_ratios, compute_ratios = [], [], []
    trainer_s, plain_s, tokens = 0.0, 0.0, 0.0
    for r in runs["paired"]:
        assert r["tokens"] == r["plain_tokens"], "the two sides must train on the same batches"
        for i in range(WARMUP, len(r["tokens"])):
            ratios.append(r["plain_s"][i] / r["trainer_s"][i])
            cpu_ratios.append(r["plain_cpu_s"][i] / r["trainer_cpu_s"][i])
            compute_ratios.append(r["plain_s"][i] / r["compute_s"][i])
            trainer_s += r["trainer_s"][i]
            plain_s += r["plain_s"][i]
            tokens += r["tokens"][i]
    figures = {
        "train_vs_plain_torch": median(ratios),
        "train_vs_plain_torch_cpu": median(cpu_ratios),
        "train_compute_vs_plain_torch": median(compute_ratios),
        "train_vs_plain_torch_total": plain_s / trainer_s,
        "trainer_tokens_per_s": tokens / trainer_s,
        "plain_tokens_per_s": tokens / plain_s,
        "peak_rss_mb": runs["trainer"][0]["peak_rss_mb"],
        "plain_peak_rss_mb": runs["plain"][0]["peak_rss_mb"],
        **lora_figures(runs["trainer"], runs["lora"]),
    }
    report("train", figures, details)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
