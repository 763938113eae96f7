"""Does a synthetic task give RL room to climb? Bootstrap, measure, then run a tiny GRPO loop.

What it is: the evidence behind the task families of ``rollflow.data.tasks`` and the warm start of
``rollflow.models.bootstrap``. For ``--task NAME`` and each ``--seeds`` value:

1. Bootstraps the tiny model for that task from scratch into a temporary directory (timed) and loads
   it back with ``AutoModelForCausalLM`` / ``AutoTokenizer`` as the servers do.
2. Base policy, on the demo's held-out prompts (``DatasetConfig``'s eval split: 200 problems, none
   seen by the warm start): greedy accuracy, sampled accuracy at T=1 and pass@8 (a prompt has a
   right answer among 8 samples). On 200 *train* prompts (what RL samples from): the fraction of
   groups of 8 samples at T=1 that are all right or all wrong (zero-variance groups: no GRPO signal),
   split by in / out of the warm start's support where the task has one (``add_gap``, ``shift_gap``),
   or by round operand (``add_habit``).
3. Learnability: a minimal on-policy GRPO loop written out here (HF ``generate`` + the task reward, no
   RL library): each step samples ``group`` completions for ``batch`` train prompts, normalises the
   rewards within each group, ``A_i = (r_i - mean(r)) / (std(r) + 1e-6)``, and takes one AdamW step on

       L = - sum_{i,t} A_i * log pi(y_{i,t} | x_i, y_{i,<t}) / (number of completion tokens)

   (on-policy, so the PPO ratio is 1 and clipping never acts). Greedy held-out accuracy is logged
   every ``--eval-every`` steps with the wall time (evaluation excluded), and the first step and
   second where it reaches 0.5 and 0.8.

What it is not: a test (it asserts nothing) or the product's trainer (``rollflow.training``), whose
steps cost more (inference server, storage, staleness) than this loop's.

Run it::

    python -m bench.task_check --task add_gap --seeds 1 2 3 --steps 600 --lr 1e-4 \\
        --json bench/results/task_check_add_gap.json
    python -m bench.task_check   # add_habit, seed 1, 100 steps at lr 2e-5 (bench/results/task_check.json)
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
from typing import Any, get_args

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rollflow.api.config import DatasetConfig, SyntheticTaskConfig, SyntheticTaskName, TinyModelConfig
from rollflow.data import load_prompts
from rollflow.models import bootstrap_tiny_model, read_marker
from rollflow.rewards.synthetic import synthetic_reward_fn

THRESHOLDS = (0.5, 0.8)


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


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _flag(row: dict[str, Any]) -> bool | None:
    """The row's breakdown flag: out of the warm start's support, or (add_habit) a round operand."""
    return row.get("out_of_support", row.get("round_operand"))


def evaluate(
    model: PreTrainedModel, tok: PreTrainedTokenizerBase, rows: list[dict[str, Any]], max_new_tokens: int
) -> dict[str, float]:
    """Greedy accuracy; for add_habit also where the +1 habit applies and on round operands."""
    _, _, greedy = sample(model, tok, rows, n=1, greedy=True, max_new_tokens=max_new_tokens)
    report = {"greedy": _mean(greedy)}
    if rows and "round_operand" in rows[0]:
        report["greedy_habit"] = _mean(
            [r for r, row in zip(greedy, rows, strict=True) if not row["round_operand"]]
        )
        report["greedy_round"] = _mean(
            [r for r, row in zip(greedy, rows, strict=True) if row["round_operand"]]
        )
    return report


def group_stats(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    group: int,
    max_new_tokens: int,
) -> dict[str, float]:
    """Sampled accuracy, pass@group and the share of zero-variance groups (all right or all wrong) at T=1.

    With a breakdown flag (see ``_flag``) the zero-variance share is also given per value of it.
    """
    _, _, rewards = sample(model, tok, rows, n=group, greedy=False, max_new_tokens=max_new_tokens)
    groups = [rewards[i * group : (i + 1) * group] for i in range(len(rows))]
    zero_var = [float(sum(g) in (0, group)) for g in groups]
    report = {
        "sampled": _mean(rewards),
        f"pass@{group}": _mean([float(any(g)) for g in groups]),
        "zero_variance": _mean(zero_var),
        "all_wrong": _mean([float(sum(g) == 0) for g in groups]),
        "all_right": _mean([float(sum(g) == group) for g in groups]),
    }
    flags = [_flag(r) for r in rows]
    if all(f is not None for f in flags):
        name = "out_of_support" if "out_of_support" in rows[0] else "round_operand"
        for value in (True, False):
            part = [z for z, f in zip(zero_var, flags, strict=True) if f is value]
            acc = [_mean(g) for g, f in zip(groups, flags, strict=True) if f is value]
            key = name if value else f"not_{name}"
            report[f"share_{key}"] = len(part) / len(rows)
            report[f"zero_variance_{key}"] = _mean(part)
            report[f"sampled_{key}"] = _mean(acc)
    return report


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


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Bootstrap, base-policy figures and the GRPO curve for one seed."""
    report: dict[str, Any] = {"seed": seed}
    t0 = time.monotonic()
    tiny = TinyModelConfig()
    if args.warm_start_steps is not None:
        tiny = dataclasses.replace(tiny, warm_start_steps=args.warm_start_steps)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = (
            Path(args.model)
            if args.model
            else bootstrap_tiny_model(
                tiny, Path(tmp) / "tiny", seed=seed, threads=args.threads, task=args.task
            )
        )
        report["bootstrap_s"] = round(time.monotonic() - t0, 1)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tok = AutoTokenizer.from_pretrained(model_dir)
        marker = read_marker(model_dir) or {}
    report["warm_start_steps"] = marker.get("warm_start", {}).get("steps", tiny.warm_start_steps)
    report["warm_start_final_loss"] = marker.get("warm_start", {}).get("final_loss")
    report["params"] = sum(p.numel() for p in model.parameters())
    print(
        f"[{args.task} seed {seed}] bootstrap: {report['bootstrap_s']} s on {args.threads} thread(s), "
        f"{report['warm_start_steps']} warm-start steps, {report['params']:,} params",
        flush=True,
    )

    cfg = DatasetConfig(synthetic=SyntheticTaskConfig(task=args.task))
    held_out = load_prompts(cfg, cfg.eval_split)
    train = load_prompts(cfg, cfg.train_split)
    torch.manual_seed(seed)
    before = evaluate(model, tok, held_out, args.max_new_tokens)
    report["held_out"] = {
        "n": len(held_out),
        **before,
        **group_stats(model, tok, held_out, group=args.group, max_new_tokens=args.max_new_tokens),
    }
    probe = train[: args.train_probe]  # the train draw is already in random order
    report["train"] = {
        "n": len(probe),
        **group_stats(model, tok, probe, group=args.group, max_new_tokens=args.max_new_tokens),
    }
    h, t = report["held_out"], report["train"]
    print(
        f"  held-out ({len(held_out)}): greedy {h['greedy']:.3f}; sampled T=1 {h['sampled']:.3f}; "
        f"pass@{args.group} {h[f'pass@{args.group}']:.3f} | train ({len(probe)}): zero-variance groups "
        f"{t['zero_variance']:.3f} (all wrong {t['all_wrong']:.3f}, all right {t['all_right']:.3f})",
        flush=True,
    )

    if args.steps > 0:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        rng = torch.Generator().manual_seed(seed)
        curve = [{"step": 0, "wall_s": 0.0, **before}]
        reached: dict[str, dict[str, float] | None] = {str(x): None for x in THRESHOLDS}
        train_s = 0.0
        for step in range(1, args.steps + 1):
            idx = torch.randint(len(train), (args.batch,), generator=rng).tolist()
            t_step = time.monotonic()
            reward = grpo_step(
                model, tok, opt, [train[i] for i in idx], group=args.group, max_new_tokens=args.max_new_tokens
            )
            train_s += time.monotonic() - t_step
            if step % args.eval_every == 0 or step == args.steps:
                ev = evaluate(model, tok, held_out, args.max_new_tokens)
                curve.append({"step": step, "wall_s": round(train_s, 1), "train_reward": reward, **ev})
                for x in THRESHOLDS:
                    if reached[str(x)] is None and ev["greedy"] >= x:
                        reached[str(x)] = {"step": step, "wall_s": round(train_s, 1)}
                print(
                    f"  step {step:4d}  {train_s:6.1f} s  train reward {reward:.3f}  held-out greedy {ev['greedy']:.3f}",
                    flush=True,
                )
        report["grpo"] = {"curve": curve, "train_s": round(train_s, 1), "reached": reached}
        print(
            f"  GRPO {train_s:.1f} s of training; held-out greedy first >= 0.5 / 0.8 at {reached}", flush=True
        )
    return report


def summary(runs: list[dict[str, Any]], group: int) -> dict[str, Any]:
    """Per-figure values over the seeds (in seed order), for reading the JSON at a glance."""
    out: dict[str, Any] = {
        "held_out_greedy": [r["held_out"]["greedy"] for r in runs],
        "held_out_sampled": [r["held_out"]["sampled"] for r in runs],
        f"held_out_pass@{group}": [r["held_out"][f"pass@{group}"] for r in runs],
        "train_zero_variance": [r["train"]["zero_variance"] for r in runs],
        "bootstrap_s": [r["bootstrap_s"] for r in runs],
    }
    if all("grpo" in r for r in runs):
        out["final_held_out_greedy"] = [r["grpo"]["curve"][-1]["greedy"] for r in runs]
        for x in THRESHOLDS:
            out[f"steps_to_{x}"] = [(r["grpo"]["reached"][str(x)] or {}).get("step") for r in runs]
            out[f"train_s_to_{x}"] = [(r["grpo"]["reached"][str(x)] or {}).get("wall_s") for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.task_check", description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="add_habit", choices=get_args(SyntheticTaskName), help="task family")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a busy 2-core box)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1], help="bootstrap (and GRPO sampling) seeds")
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
    ap.add_argument("--train-probe", type=int, default=200, help="train prompts for the zero-variance share")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "task": args.task,
        "threads": args.threads,
        "grpo": {
            "lr": args.lr,
            "batch": args.batch,
            "group": args.group,
            "steps": args.steps,
            "temperature": 1.0,
        },
    }
    runs = [run_seed(args, seed) for seed in args.seeds]
    report["summary"] = summary(runs, args.group)
    report["runs"] = runs
    print(json.dumps(report["summary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
