"""The GPU check: rollflow's trainer, weight update and logprobs on one CUDA GPU, in a few minutes.

Run (one H100 or H200, no network; sized for well under 8 minutes, an estimate until it has run on one):
    python -m bench.gpu_check --device cuda --out bench/results/gpu_check.json
CI runs it tiny on CPU so that it never rots (seconds):
    python -m bench.gpu_check --device cpu --tiny

What it measures, on a Qwen2.5-0.5B-shaped model built from its config (random weights, no hub):

1. train: the trainer's own step (``PolicyActor``: proximal logprobs, group advantages, the decoupled PPO
   loss, AdamW) under FSDP2 with one rank, fp32 master weights and bf16 compute, on synthetic groups of
   1,024-token sequences (256 prompt + 768 completion tokens). ``train_tokens_per_s`` (trained tokens /
   step time, after a warm-up step), ``train_peak_mem_GB`` and ``train_mfu``:

       MFU = tokens/s x FLOPs per token / peak FLOP/s,
       FLOPs per token = (6N + 12 L d T)  [forward + backward]  +  (2N + 4 L d T)  [proximal forward]

   with N the parameters (tied embedding counted once), L layers, d hidden size, T the sequence length
   (PaLM, appendix B); peak = ``--peak-tflops`` or the card's dense bf16 figure (H100/H200: 989).
2. weight update: the trained weights gathered to a full state dict, published through rollflow's
   storage (``CheckpointPublisher``: safetensors hashed while written, COMMIT.json, LATEST) to local
   disk, then loaded into a second model on the device by the watcher's one-read path (each weight file
   read once into host memory while a second thread hashes it; used only if COMMIT.json's digest
   matches). ``publish_s``, ``weight_update_s`` (verified read + copy to the device; of which
   ``weight_verify_s`` is the verified read) and ``weight_update_GBps``.
3. logprob agreement: greedy and sampled (temperature 1) generation from the second (bf16) model with
   its per-token logprobs (the KV-cached decode path), then the trainer's logprobs of the same tokens
   in bf16 (the FSDP2 model's forward) and fp32 (its master weights, fp32 compute):
   ``{greedy,sampled}_{bf16,fp32}_{max,mean}_abs_dlogp``. This is the training-inference mismatch
   truncated importance sampling exists for; random weights give near-uniform distributions, so treat
   the figures as numerics, not as a trained model's.

It prints ``key value`` lines and writes them, with the device and the settings, to ``--out``.

What it is not: a benchmark of SGLang or vLLM (neither is installed where it runs) or a test. It imports
only torch, transformers, safetensors and rollflow's trainer and storage modules (never Prefect or MLflow).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import qwen2_shapes

# Dense bf16 tensor-core peaks (vendor datasheets, SXM parts); --peak-tflops overrides.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


@dataclass
class Settings:
    size: str = "0.5b"
    prompt_len: int = 256
    completion_len: int = 768
    groups: int = 8
    group_size: int = 4
    steps: int = 6  # measured, after one warm-up step
    max_tokens_per_mb: int = 8192
    gen_prompts: int = 4
    gen_prompt_len: int = 64
    gen_new_tokens: int = 128
    lr: float = 1e-5
    gradient_checkpointing: bool = False


# The memory sweep (--memory): the trainer's peak memory for one step whose micro-batch holds this many
# tokens (sequences of prompt_len + completion_len), per shape, with and without gradient checkpointing.
# It sizes the trainer beside an SGLang server on one GPU (rollflow plan; docs/gpu.md).
MEMORY_SIZES = ("0.5b", "1.5b")
MEMORY_MB_TOKENS = (4096, 8192, 16384)


TINY = Settings(
    size="tiny", prompt_len=16, completion_len=48, groups=2, group_size=2, steps=1, max_tokens_per_mb=256,
    gen_prompts=2, gen_prompt_len=8, gen_new_tokens=8,
)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def synthetic_batch(s: Settings, vocab: int, seed: int = 0) -> Any:
    """``groups`` x ``group_size`` sequences of prompt_len + completion_len random tokens, a shared prompt
    per group, behaviour logprobs around log(1/V) (corrected after the proximal pass), 0/1 rewards."""
    from rollflow.training.batching import GroupInfo, TrainBatch

    gen = torch.Generator().manual_seed(seed)
    n, t = s.groups * s.group_size, s.prompt_len + s.completion_len
    prompts = torch.randint(1, vocab, (s.groups, s.prompt_len), generator=gen)  # [G, P]
    ids = torch.randint(1, vocab, (n, t), generator=gen)  # [B, T]
    ids[:, : s.prompt_len] = prompts.repeat_interleave(s.group_size, dim=0)
    loss_mask = torch.zeros(n, t)
    loss_mask[:, s.prompt_len :] = 1.0  # [B, T]
    groups = [
        GroupInfo(f"g{g}", 0, tuple(range(g * s.group_size, (g + 1) * s.group_size)), s.group_size * t)
        for g in range(s.groups)
    ]
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones(n, t, dtype=torch.bool),
        loss_mask=loss_mask,
        behav_logp=-math.log(vocab) * loss_mask,
        versions=torch.where(loss_mask > 0, 0, -1),  # [B, T] all sampled by v0
        rewards=(torch.rand(n, generator=gen) < 0.5).float(),
        group_index=torch.arange(n) // s.group_size,
        groups=groups,
    )


def train_part(
    s: Settings, device: torch.device, peak_tflops: float | None
) -> tuple[dict[str, float], Any, Any]:
    """Step 1; returns the figures, the FSDP2 policy and its DistContext."""
    from rollflow.api.config import TrainConfig
    from rollflow.training.actor import PolicyActor
    from rollflow.training.distributed import init_distributed, wrap_model
    from rollflow.training.microbatch import plan_step
    from rollflow.training.optim import build_optimizer, build_scheduler

    cfg = TrainConfig(
        steps=s.steps + 1, batch_size=s.groups, max_tokens_per_mb=s.max_tokens_per_mb, lr=s.lr,
        dtype="bfloat16", distributed="fsdp2", ppo_epochs=1,
    )  # fmt: skip
    ctx = init_distributed("fsdp2")
    model = qwen2_shapes.build(s.size, dtype=torch.float32, device=device)  # fp32 master weights
    model.config.use_cache = False
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = qwen2_shapes.param_count(model)
    model = wrap_model(model, ctx, bf16=True)
    opt = build_optimizer(model.named_parameters(), lr=cfg.lr)
    sched = build_scheduler(opt, warmup_steps=0, total_steps=cfg.steps, schedule="constant")
    actor = PolicyActor(model, opt, sched, ctx, cfg)
    vocab = model.config.vocab_size
    times: list[float] = []
    metrics: dict[str, float] = {}
    for step in range(s.steps + 1):
        batch = synthetic_batch(s, vocab, seed=step)
        plans = plan_step(
            [g.n_tokens for g in batch.groups], n_minibatches=1, world_size=1, rank=0,
            max_tokens_per_mb=s.max_tokens_per_mb,
        )  # fmt: skip
        _sync(device)
        t0 = time.perf_counter()
        batch.advantages = actor.compute_advantages(batch)
        batch.prox_logp = actor.compute_logp(model, batch, plans)  # [B, T]
        if step == 0:  # behaviour = proximal + noise, so the importance weights are not all 1
            noise = torch.randn(batch.prox_logp.shape, generator=torch.Generator().manual_seed(1)) * 0.05
            batch.behav_logp = (batch.prox_logp + noise) * batch.loss_mask
        else:
            batch.behav_logp = batch.prox_logp.clone()
        metrics = actor.ppo_update(batch, plans)
        _sync(device)
        if step > 0:  # step 0 warms up kernels and the allocator
            times.append(time.perf_counter() - t0)
    tokens = s.groups * s.group_size * (s.prompt_len + s.completion_len)
    step_s = sorted(times)[len(times) // 2]
    cfg_model = model.config
    seq = s.prompt_len + s.completion_len
    flops_tok = qwen2_shapes.train_flops_per_token(cfg_model, n_params, seq) * 4 / 3  # + proximal forward
    figures = {
        "params_M": n_params / 1e6,
        "train_step_s": step_s,
        "train_tokens_per_s": tokens / step_s,
        "train_peak_mem_GB": _peak_mem_gb(device),
        "train_loss": float(metrics.get("loss", float("nan"))),
        "train_grad_norm": float(metrics.get("grad_norm", float("nan"))),
    }
    if peak_tflops:
        figures["train_mfu"] = tokens / step_s * flops_tok / (peak_tflops * 1e12)
    return figures, model, ctx


def update_part(
    model: Any, ctx: Any, device: torch.device, root: Path
) -> tuple[dict[str, float], Any, dict[str, torch.Tensor]]:
    """Step 2; returns the figures, the loaded bf16 inference model and the fp32 master state dict."""
    from rollflow.models.verified_weights import load_verified_dir
    from rollflow.training.distributed import full_model_state_dict
    from rollflow.training.publish import CheckpointPublisher, tied_aliases
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    aliases = tied_aliases(model)
    master = {k: v for k, v in full_model_state_dict(model, ctx).items() if k not in aliases}  # fp32, CPU
    store = CheckpointStore(Storage.open(str(root / "store"), "gpu-check", "t"))
    publisher = CheckpointPublisher(
        store, config=model.config, tokenizer=None, architecture="Qwen2ForCausalLM", dtype=torch.bfloat16,
        background=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    assert publisher.submit(1, master, step=1)
    publish_s = time.perf_counter() - t0
    nbytes = sum(f["size"] for f in store.get(1).files.values())
    inference = qwen2_shapes.build(
        _size_of(model), dtype=torch.bfloat16, device=device, seed=2
    )  # "the server"
    inference.eval()
    _sync(device)
    t0 = time.perf_counter()
    ref = store.get(1)
    # the watcher's one-read path: layout, links and sizes checked here, then each weight file read once
    # while a second thread hashes the same bytes; tensors only if COMMIT.json's digest matches
    ckpt = store.verified_dir(1, root / "cache", defer_weights=True)
    sd = load_verified_dir(ckpt, ref.files, ref.hash_algo)
    verify_s = time.perf_counter() - t0  # layout check + the verified read into host memory
    missing, unexpected = inference.load_state_dict(sd, strict=False)  # the copy to the device
    _sync(device)
    update_s = time.perf_counter() - t0
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    figures = {
        "checkpoint_GB": nbytes / 1e9,
        "publish_s": publish_s,
        "weight_update_s": update_s,
        "weight_verify_s": verify_s,  # the verified read (hash beside it) part of weight_update_s
        "weight_update_GBps": nbytes / 1e9 / update_s,
        "hash": store.hash_algo,
    }
    return figures, inference, master


def _size_of(model: Any) -> str:
    d = model.config.hidden_size
    return next(k for k, v in qwen2_shapes.SHAPES.items() if v["hidden_size"] == d)


@torch.no_grad()
def generate_with_logprobs(
    model: Any, prompts: torch.Tensor, new_tokens: int, *, sample: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences [P, prompt + new], logprobs [P, new] of the chosen tokens), from the model's own
    decode (KV cache, its dtype), temperature 1 and no top-k/top-p when sampling."""
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=sample, temperature=1.0 if sample else None, top_k=0 if sample else None,
        top_p=1.0 if sample else None, output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        eos_token_id=None,
    )  # fmt: skip
    logits = torch.stack(out.logits, dim=1).float()  # [P, new, V]
    chosen = out.sequences[:, prompts.shape[1] :]  # [P, new]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, chosen[..., None]).squeeze(-1)  # [P, new]
    return out.sequences, logp


@torch.no_grad()
def trainer_logprobs(model: Any, sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The trainer's logprobs [P, new] of the generated tokens (one full forward, as training does)."""
    from rollflow.training.logprobs import forward_logprobs

    was = model.training
    model.eval()
    logp, _ = forward_logprobs(model, sequences)  # [P, T]; position t scores token t
    model.train(was)
    return logp[:, prompt_len:].float()


def logprob_part(
    s: Settings, policy: Any, inference: Any, master: dict[str, torch.Tensor], device: torch.device
) -> dict[str, float]:
    """Step 3."""
    gen = torch.Generator().manual_seed(7)
    vocab = inference.config.vocab_size
    prompts = torch.randint(1, vocab, (s.gen_prompts, s.gen_prompt_len), generator=gen).to(device)  # [P, p]
    fp32 = qwen2_shapes.build(_size_of(policy), dtype=torch.float32, device=device, seed=3)
    fp32.load_state_dict({k: v.to(device) for k, v in master.items()}, strict=False)
    fp32.tie_weights()
    fp32.eval()
    figures: dict[str, float] = {}
    for mode in ("greedy", "sampled"):
        seqs, infer_logp = generate_with_logprobs(
            inference, prompts, s.gen_new_tokens, sample=mode == "sampled", seed=11
        )
        for name, model in (("bf16", policy), ("fp32", fp32)):
            delta = (trainer_logprobs(model, seqs, s.gen_prompt_len) - infer_logp.float()).abs()  # [P, new]
            figures[f"{mode}_{name}_max_abs_dlogp"] = float(delta.max())
            figures[f"{mode}_{name}_mean_abs_dlogp"] = float(delta.mean())
        figures[f"{mode}_mean_logp"] = float(infer_logp.mean())
    return figures


def memory_part(base: Settings, device: torch.device, sizes: tuple[str, ...]) -> dict[str, float]:
    """The memory sweep: ``mem_<size>_mb<tokens>_gc<0|1>_GB``, the peak allocated memory of two trainer steps
    (fp32 master weights, AdamW state, bf16 compute) with one micro-batch of that many tokens; ``nan`` where
    the device ran out of memory."""
    figures: dict[str, float] = {}
    seq = base.prompt_len + base.completion_len
    for size in sizes:
        for mb in MEMORY_MB_TOKENS if size != "tiny" else (256,):
            for gc in (False, True):
                n_seq = max(1, mb // seq)
                s = Settings(
                    size=size, prompt_len=base.prompt_len, completion_len=base.completion_len, groups=n_seq,
                    group_size=1, steps=1, max_tokens_per_mb=n_seq * seq, gradient_checkpointing=gc,
                )  # fmt: skip
                key = f"mem_{size}_mb{mb}_gc{int(gc)}_GB"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    train, model, ctx = train_part(s, device, None)
                    figures[key] = train["train_peak_mem_GB"]
                    figures[key.replace("_GB", "_step_s")] = train["train_step_s"]
                    ctx.shutdown()
                    del model, ctx
                except torch.OutOfMemoryError:
                    figures[key] = float("nan")
                print(f"{key} {figures[key]:.6g}", flush=True)
    return figures


def _peak(device: torch.device, given: float | None) -> tuple[str, float | None]:
    if device.type != "cuda":
        return platform.processor() or platform.machine(), given
    name = torch.cuda.get_device_name(device)
    return name, given or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _shown(figures: dict[str, Any]) -> dict[str, Any]:
    """Prints each figure as a ``key value`` line as soon as its part ends (a run cut short keeps them)."""
    for k, v in figures.items():
        print(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (CI, with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (CI on CPU, seconds)")
    ap.add_argument("--steps", type=int, default=None, help="measured trainer steps (default 6, tiny 1)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak for MFU")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/gpu_check[_tiny].json)")
    ap.add_argument(
        "--memory", action="store_true",
        help="also the memory sweep: trainer peak memory per micro-batch size, 0.5B and 1.5B shapes",
    )  # fmt: skip
    ap.add_argument("--dir", default=None, help="where the checkpoint is published (default: a temp dir)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_check: error: no CUDA device; run with --device cpu --tiny for the CPU smoke run",
            file=sys.stderr,
        )
        return 2
    s = TINY if args.tiny else Settings()
    if args.steps:
        s.steps = args.steps
    if device.type == "cuda":
        torch.cuda.set_device(device)
        os.environ.setdefault("LOCAL_RANK", str(device.index))  # init_distributed puts rank 0 there
    card, peak = _peak(device, args.peak_tflops)
    print(f"# device {card}", flush=True)
    t_start = time.perf_counter()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollflow-gpu-check-", dir=args.dir) as tmp:
        train, policy, ctx = train_part(s, device, peak)
        figures.update(_shown(train))
        update, inference, master = update_part(policy, ctx, device, Path(tmp))
        figures.update(_shown(update))
        figures.update(_shown(logprob_part(s, policy, inference, master, device)))
        ctx.shutdown()
        del policy, inference, master
    if args.memory:
        figures.update(memory_part(s, device, ("tiny",) if args.tiny else MEMORY_SIZES))
    figures.update(_shown({"wall_s": time.perf_counter() - t_start}))
    out = (
        Path(args.out)
        if args.out
        else Path(__file__).parent / "results" / f"gpu_check{'_tiny' if args.tiny else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "device": card, "torch": torch.__version__, "cuda": torch.version.cuda, "peak_bf16_tflops": peak,
        "settings": s.__dict__, "figures": figures,
    }  # fmt: skip
    out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"# wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
