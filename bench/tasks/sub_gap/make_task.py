"""Build the outside task ``sub_gap``: a small Llama policy with its own tokenizer and chat template, plus
its train/test JSONL files, written the way a user brings a model (transformers, tokenizers and torch only).

What it is. ``python -m bench.tasks.sub_gap.make_task --out DIR [--seed 0]`` writes

    DIR/model/        save_pretrained: config.json, generation_config.json, model.safetensors, tokenizer
    DIR/train.jsonl   the RL prompts, one {"uid", "problem", "solution", "kind"} per line
    DIR/test.jsonl    the held-out prompts, same fields
    DIR/task.json     the manifest, written last (its presence means the build finished): seed, sizes,
                      warm-start losses, the base policy's greedy accuracies, build seconds

in about a minute on one core (everything goes to a temporary sibling first, then is renamed into place).

**The task**: two-digit subtraction without borrowing, ``"73-21"`` -> ``"52"`` (10 <= b <= a <= 99 and
ones(a) >= ones(b): 2,475 problems); the reward (``reward.py``) is exact match of the stripped
completion. Answers are 1-2 characters, then ``</s>``.

* **Gap problems**: the first operand's tens digit is 6 or 7 (715 problems). The warm start's teacher
  does not know their tens digit: it gives the right ones digit and a tens digit drawn uniformly from the
  ones possible (0 to tens(a) - 1), afresh each time. So the base policy has the format and the ones digit
  but only a guess at the tens digit - right about one time in six or seven, greedy or sampled - and
  GRPO has signal on most gap groups (about two in three have a right sample out of 8) and none on the rest.
* **Held-out** (``test.jsonl``, 205 problems): the gap problems whose ``sha256(problem)`` first byte is
  below 80 (~31 %). The warm start never sees them; what RL learns on the train gap problems (the tens
  digit of ``6x-yz`` and ``7x-yz``) is what carries over.
* **Train** (``train.jsonl``, 2,270 problems): the 1,760 seen problems and the other 510 gap problems
  (``kind`` says which). Splits and row order depend on the problem text only, never on the seed.

Measured (2026-11-25, 900 warm-start steps, 1 thread): held-out greedy accuracy on the first 200
(``eval.n_prompts``) 0.18 (seed 0, the default), 0.125 (seed 1), 0.23 (seed 2); seen problems 1.0.

**The tokenizer** is its own, not rollflow's: a ``tokenizers`` WordLevel model with one token per printable
ASCII character and newline, and four specials ``<pad>`` (0), ``<s>`` (1, BOS), ``</s>`` (2, EOS),
``<unk>`` (3). As in Llama tokenizers, a ``TemplateProcessing`` post-processor prepends ``<s>`` whenever
``add_special_tokens=True``: a caller that renders the chat template *and* adds special tokens gets two
BOS tokens, which the user-path tests (tests/user_path/) check rollflow never does.

**The chat template** is its own too (not ChatML)::

    <s>Q: 73-21\nA: 52</s>\n            a user turn, then an assistant turn
    <s>Q: 73-21\nA:                      add_generation_prompt=True: what generation starts from

A system turn is its bare text on a line. ``</s>`` closes an assistant turn and is the EOS of the
tokenizer, the model config and the generation config, so a completion ends with it.

**The warm start** is plain torch: ``--steps`` AdamW steps (batch 64, lr 2e-3, 30 warm-up steps then a
cosine to 10 %) on the train split with the teacher's labels, the loss on the answer and ``</s>`` only.
The model is a ``LlamaForCausalLM`` (hidden 96, 3 layers, 4 heads, 2 KV heads, untied embeddings,
324k parameters). At lr 3e-3 one seed in three stalled or diverged; at 600 steps the seen problems are
at 0.9.

Deterministic: the same ``--seed``, ``--steps`` and ``--threads`` (and torch build) give the same files.

What it is not: rollflow code. It imports nothing from rollflow, which is the point: rollflow meets this
model only through ``model.path``, the ``files`` dataset and the ``module:function`` reward, as a user's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
CHARACTERS = tuple(chr(i) for i in range(32, 127)) + ("\n",)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ 'Q: ' + m['content'] + '\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ 'A: ' + m['content'] + eos_token + '\\n' }}"
    "{% else %}{{ m['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"
)
GAP_TENS = (6, 7)  # tens digits of the first operand whose answers' tens digit the teacher guesses
HELD_OUT_BYTE_BELOW = 80  # of the gap problems, sha256 first byte < 80 (~31 %) is held out
ARCH: dict[str, int] = {
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
MAX_POSITIONS = 64
BATCH, LR, WARMUP = 64, 2e-3, 30


# --- the task --------------------------------------------------------------------------------------------


def problems() -> list[tuple[int, int]]:
    """Every ``(a, b)`` with 10 <= b <= a <= 99 and no borrow (ones(a) >= ones(b)), in a fixed order."""
    return [(a, b) for a in range(10, 100) for b in range(10, a + 1) if a % 10 >= b % 10]


def in_gap(a: int, b: int) -> bool:
    """A problem whose tens digit the warm start's teacher does not know."""
    del b
    return a // 10 in GAP_TENS


def is_held_out(a: int, b: int) -> bool:
    return in_gap(a, b) and hashlib.sha256(f"{a}-{b}".encode()).digest()[0] < HELD_OUT_BYTE_BELOW


def row(a: int, b: int) -> dict[str, str]:
    return {"uid": f"sub-{a}-{b}", "problem": f"{a}-{b}", "solution": str(a - b),
            "kind": "gap" if in_gap(a, b) else "seen"}  # fmt: skip


def splits() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train rows, test rows), each in ``sha256(uid)`` order: a fixed, scrambled order for any seed."""
    train, test = [], []
    for a, b in problems():
        (test if is_held_out(a, b) else train).append(row(a, b))
    key = lambda r: hashlib.sha256(r["uid"].encode()).hexdigest()  # noqa: E731
    return sorted(train, key=key), sorted(test, key=key)


# --- tokenizer and model ---------------------------------------------------------------------------------


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Per-character WordLevel tokenizer with ``<s>`` prepended on ``add_special_tokens=True``."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(""), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def build_model(tok: PreTrainedTokenizerFast, arch: dict[str, int]) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **arch,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    return model


def prompt_ids(tok: PreTrainedTokenizerFast, problem: str) -> list[int]:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": problem}], add_generation_prompt=True, tokenize=False
    )
    return list(tok.encode(rendered, add_special_tokens=False))


def teacher_label(r: dict[str, str], rng: random.Random) -> str:
    """The warm start's label: the solution on a seen problem; on a gap problem the right ones digit after a
    tens digit drawn uniformly from those a subtraction with that first operand can give (0 to tens(a) - 1;
    a tens digit of 0 is written as no digit, as in ``"76-70"`` -> ``"6"``).
    """
    if r["kind"] != "gap":
        return r["solution"]
    a = int(r["problem"].split("-")[0])
    tens = rng.randrange(a // 10)
    ones = int(r["solution"]) % 10
    return str(10 * tens + ones)


# --- warm start and base accuracy ------------------------------------------------------------------------


def warm_start(
    model: LlamaForCausalLM,
    tok: PreTrainedTokenizerFast,
    rows: list[dict[str, str]],
    *,
    steps: int,
    seed: int,
) -> dict[str, float]:
    """Supervised steps on ``rows`` with ``teacher_label``'s labels; the loss covers answer + ``</s>`` only::

    L = - sum_t m_t log p(x_t | x_<t) / sum_t m_t        (m_t = 1 on completion tokens)
    """
    rng = random.Random(f"sub_gap-warm-start:{seed}")
    encoded = [(prompt_ids(tok, r["problem"]), r) for r in rows]
    width = max(len(p) for p, _ in encoded) + 3  # + two answer characters and </s>
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        scale = min(1.0, (step + 1) / WARMUP) * (0.1 + 0.45 * (1.0 + math.cos(math.pi * step / steps)))
        for group in opt.param_groups:
            group["lr"] = LR * scale
        ids, mask = [], []
        for _ in range(BATCH):
            p, r = encoded[rng.randrange(len(encoded))]
            c = tok.encode(teacher_label(r, rng), add_special_tokens=False)
            pad = width - len(p) - len(c) - 1
            ids.append(p + c + [tok.eos_token_id] + [tok.pad_token_id] * pad)
            mask.append([0] * len(p) + [1] * (len(c) + 1) + [0] * pad)
        # right padding after </s>: causal attention never looks ahead, so no attention mask is needed
        x, m = torch.tensor(ids), torch.tensor(mask)  # [B, W] x 2
        logits = model(input_ids=x).logits[:, :-1]  # [B, W-1, V]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none"
        ).view_as(x[:, 1:])  # [B, W-1]
        loss = (nll * m[:, 1:]).sum() / m[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0:
            print(f"# warm start step {step + 1}/{steps} loss {losses[-1]:.4f}", file=sys.stderr, flush=True)
    model.eval()
    tail = losses[-20:] or [math.nan]
    return {"first_loss": losses[0] if losses else math.nan, "final_loss": sum(tail) / len(tail)}


@torch.no_grad()
def greedy_accuracy(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, rows: list[dict[str, str]], max_new_tokens: int = 8
) -> float:
    """Share of ``rows`` whose greedy completion (special tokens skipped, stripped) is the solution."""
    prompts = [prompt_ids(tok, r["problem"]) for r in rows]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])  # [N, P] left-padded
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [N, P]
    out = model.generate(
        input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(t.strip() == r["solution"] for t, r in zip(texts, rows, strict=True)) / max(1, len(rows))


# --- the build -------------------------------------------------------------------------------------------


def build(out: Path, *, seed: int, steps: int, arch: dict[str, int], threads: int) -> dict[str, Any]:
    """Write the task into ``out`` (see the module docstring); an existing ``out`` must hold a manifest."""
    t0 = time.monotonic()
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "task.json").exists():
        raise FileExistsError(f"{out} exists and holds no task.json; remove it or choose another --out")
    torch.set_num_threads(threads)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    (tmp / "model").mkdir(parents=True)
    try:
        train, test = splits()
        for name, rows in (("train", train), ("test", test)):
            with (tmp / f"{name}.jsonl").open("w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
        tok = build_tokenizer()
        torch.manual_seed(seed)
        model = build_model(tok, arch)
        losses = warm_start(model, tok, train, steps=steps, seed=seed)
        model.save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")
        gap_train = [r for r in train if r["kind"] == "gap"]
        seen = [r for r in train if r["kind"] == "seen"]
        manifest = {
            "task": "sub_gap",
            "seed": seed,
            "warm_start_steps": steps,
            "arch": arch,
            "params": sum(p.numel() for p in model.parameters()),
            "n_train": len(train),
            "n_train_gap": len(gap_train),
            "n_test": len(test),
            **losses,
            "base_greedy_acc_test": greedy_accuracy(model, tok, test),
            "base_greedy_acc_test_first200": greedy_accuracy(model, tok, test[:200]),
            "base_greedy_acc_train_gap": greedy_accuracy(model, tok, gap_train),
            "base_greedy_acc_seen_first300": greedy_accuracy(model, tok, seen[:300]),
            "torch": torch.__version__,
            "threads": threads,
            "build_seconds": round(time.monotonic() - t0, 1),
        }
        (tmp / "task.json").write_text(json.dumps(manifest, indent=1) + "\n")  # last: the build is complete
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", required=True, help="directory to write (model/, train.jsonl, test.jsonl, task.json)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=900, help="warm-start steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the weights depend on it)")
    p.add_argument(
        "--hidden", type=int, default=ARCH["hidden_size"], help="hidden size (tests build a tiny one)"
    )
    p.add_argument("--layers", type=int, default=ARCH["num_hidden_layers"])
    args = p.parse_args(argv)
    arch = {**ARCH, "hidden_size": args.hidden, "num_hidden_layers": args.layers,
            "intermediate_size": ARCH["intermediate_size"] * args.hidden // ARCH["hidden_size"]}  # fmt: skip
    manifest = build(Path(args.out), seed=args.seed, steps=args.steps, arch=arch, threads=args.threads)
    for key in ("base_greedy_acc_test", "base_greedy_acc_test_first200", "base_greedy_acc_train_gap",
                "base_greedy_acc_seen_first300", "final_loss", "build_seconds"):  # fmt: skip
        print(f"{key} {manifest[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
