"""Does the embedded default's task give RL room to climb? Bootstrap, measure, then run a tiny GRPO loop.

What it is: the evidence behind ``rollflow.data.synthetic`` and ``rollflow.models.bootstrap``.

1. Bootstraps the tiny model from scratch into a temporary directory (timed) and loads it back with
   ``AutoModelForCausalLM`` / ``AutoTokenizer`` as the servers do.
2. On the demo's held-out prompts (``DatasetConfig()``'s eval split: 200 problems) it reports greedy
   accuracy (overall / where the +1 habit applies / round operands), sampled accuracy at T=1, and
   pass@8 (the fraction of prompts with at least one right answer in 8 samples; a GRPO group of 8
   only has signal when it holds a right and a wrong answer).
3. Learnability: a minimal on-policy GRPO loop written out here (HF ``generate`` + the task reward, no
   RL library): each step samples ``group`` completions for ``batch`` train prompts, normalises the
   rewards within each group, ``A_i = (r_i - mean(r)) / (std(r) + 1e-6)``, and takes one AdamW step on

       L = - sum_{i,t} A_i * log pi(y_{i,t} | x_i, y_{i,<t}) / (number of completion tokens)

   (on-policy, so the PPO ratio is 1 and clipping never acts). Greedy held-out accuracy is printed
   every ``--eval-every`` steps with the wall time, and the step where it first reaches 0.8.

What it is not: a test (it asserts nothing) or the product's trainer (``rollflow.training``).

Run it::

    python -m bench.task_check [--threads 1] [--seed 1] [--steps 100] [--lr 2e-5] [--json bench/results/task_check.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rollflow.api.config import DatasetConfig, TinyModelConfig
from rollflow.data import load_prompts
from rollflow.models import bootstrap_tiny_model, read_marker
from rollflow.rewards.synthetic import synthetic_reward_fn


def encode(tok: PreTrainedTokenizerBase, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Chat-rendered prompts, left-padded: ``input_ids`` / ``attention_mask`` ``[N, P]``."""
    texts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
    return dict(tok(texts, return_tensors="pt", padding=True, add_special_tokens=False))


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    n: int,
    greedy: bool,
    max_new_tokens: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[float]]:
    """``n`` completions per row: (prompt batch repeated ``[N*n, P]``, completions ``[N*n, C]``, rewards)."""
    batch = {k: v.repeat_interleave(n, dim=0) for k, v in encode(tok, rows).items()}
    kwargs: dict[str, Any] = (
        {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    )
    model.eval()
    out = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **kwargs,
    )
    completions = out[:, batch["input_ids"].shape[1] :]  # [N*n, C]
    texts = tok.batch_decode(completions, skip_special_tokens=True)
    rewards = [synthetic_reward_fn("", t, rows[i // n]["answer"]) for i, t in enumerate(texts)]
    return batch, completions, rewards


def evaluate(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, rows: list[dict[str, Any]], max_new_tokens: int
) -> dict[str, float]:
    _, _, greedy = sample(model, tok, rows, n=1, greedy=True, max_new_tokens=max_new_tokens)
    habit = [r for r, row in zip(greedy, rows, strict=True) if not row["round_operand"]]
    exempt = [r for r, row in zip(greedy, rows, strict=True) if row["round_operand"]]
    return {
        "greedy": statistics.fmean(greedy),
        "greedy_habit": statistics.fmean(habit) if habit else float("nan"),
        "greedy_round": statistics.fmean(exempt) if exempt else float("nan"),
    }


def grpo_step(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    opt: torch.optim.Optimizer,
    rows: list[dict[str, Any]],
    *,
    group: int,
    max_new_tokens: int,
) -> float:
    """One on-policy GRPO step (see the module docstring); returns the mean reward of the batch."""
    batch, comp, rewards = sample(model, tok, rows, n=group, greedy=False, max_new_tokens=max_new_tokens)
    r = torch.tensor(rewards).view(len(rows), group)  # [B, G]
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)  # [B*G]
    is_eos = (comp == tok.eos_token_id).long()  # [B*G, C]
    comp_mask = ((is_eos.cumsum(1) - is_eos) == 0).long()  # up to and including the first EOS
    attn = torch.cat([batch["attention_mask"], comp_mask], dim=1)  # [B*G, P+C]
    input_ids = torch.cat([batch["input_ids"], comp], dim=1)  # [B*G, P+C]
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)  # as generate() numbers left-padded prompts
    model.train()
    p = batch["input_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids).logits[:, p - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)  # [B*G, C]
    mask = comp_mask.float()
    loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(r.mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.task_check", description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a busy 2-core box)")
    ap.add_argument("--seed", type=int, default=1, help="bootstrap seed")
    ap.add_argument(
        "--model", default=None, help="use this bootstrap directory instead of building a fresh one"
    )
    ap.add_argument("--warm-start-steps", type=int, default=None, help="override model.tiny.warm_start_steps")
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps (0: skip the learnability check)")
    ap.add_argument("--lr", type=float, default=2e-5, help="GRPO AdamW learning rate")
    ap.add_argument("--batch", type=int, default=16, help="prompts per GRPO step")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"threads": args.threads, "seed": args.seed}

    t0 = time.monotonic()
    tiny = TinyModelConfig()
    if args.warm_start_steps is not None:
        tiny = dataclasses.replace(tiny, warm_start_steps=args.warm_start_steps)
    report["warm_start_steps"] = tiny.warm_start_steps
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = (
            Path(args.model)
            if args.model
            else bootstrap_tiny_model(tiny, Path(tmp) / "tiny", seed=args.seed, threads=args.threads)
        )
        report["bootstrap_s"] = round(time.monotonic() - t0, 1)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tok = AutoTokenizer.from_pretrained(model_dir)
    report["params"] = sum(p.numel() for p in model.parameters())
    if args.model:
        marker = read_marker(model_dir) or {}
        tiny = TinyModelConfig(**marker.get("key", {}).get("tiny", {}))
        report["warm_start_steps"] = tiny.warm_start_steps
    print(
        f"bootstrap: {report['bootstrap_s']} s on {args.threads} thread(s), {tiny.warm_start_steps} "
        f"warm-start steps, {report['params']:,} params",
        flush=True,
    )

    cfg = DatasetConfig()
    held_out = load_prompts(cfg, cfg.eval_split)
    train = load_prompts(cfg, cfg.train_split)
    torch.manual_seed(0)
    before = evaluate(model, tok, held_out, args.max_new_tokens)
    _, _, sampled = sample(model, tok, held_out, n=8, greedy=False, max_new_tokens=args.max_new_tokens)
    per_prompt = [sampled[i * 8 : (i + 1) * 8] for i in range(len(held_out))]
    report["before"] = {
        **before,
        "sampled": statistics.fmean(sampled),
        "pass@8": statistics.fmean(float(any(s)) for s in per_prompt),
        "groups_with_signal": statistics.fmean(float(0 < sum(s) < 8) for s in per_prompt),
    }
    b = report["before"]
    print(
        f"held-out ({len(held_out)} prompts): greedy {b['greedy']:.3f} (habit {b['greedy_habit']:.3f}, "
        f"round operand {b['greedy_round']:.3f}); sampled T=1 {b['sampled']:.3f}; pass@8 {b['pass@8']:.3f}; "
        f"groups of 8 with signal {b['groups_with_signal']:.3f}",
        flush=True,
    )

    if args.steps > 0:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        rng = torch.Generator().manual_seed(args.seed)
        curve = [{"step": 0, "wall_s": 0.0, **before}]
        reached = None
        t_rl = time.monotonic()
        print(
            f"GRPO: lr {args.lr}, {args.batch} prompts x {args.group} samples, T=1, max_new_tokens {args.max_new_tokens}"
        )
        for step in range(1, args.steps + 1):
            idx = torch.randint(len(train), (args.batch,), generator=rng).tolist()
            reward = grpo_step(
                model, tok, opt, [train[i] for i in idx], group=args.group, max_new_tokens=args.max_new_tokens
            )
            if step % args.eval_every == 0 or step == args.steps:
                ev = evaluate(model, tok, held_out, args.max_new_tokens)
                wall = time.monotonic() - t_rl
                curve.append({"step": step, "wall_s": round(wall, 1), "train_reward": reward, **ev})
                if reached is None and ev["greedy"] >= 0.8:
                    reached = {"step": step, "wall_s": round(wall, 1)}
                print(
                    f"  step {step:4d}  {wall:6.1f} s  train reward {reward:.3f}  held-out greedy {ev['greedy']:.3f} "
                    f"(habit {ev['greedy_habit']:.3f}, round operand {ev['greedy_round']:.3f})",
                    flush=True,
                )
        report["grpo"] = {
            "lr": args.lr,
            "batch": args.batch,
            "group": args.group,
            "curve": curve,
            "wall_s": round(time.monotonic() - t_rl, 1),
            "reached_0.8": reached,
        }
        print(f"GRPO wall time {report['grpo']['wall_s']} s; greedy >= 0.8 first at {reached}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
