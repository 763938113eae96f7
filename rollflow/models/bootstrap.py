"""Build the embedded default's policy: a tiny Llama, warm-started on the synthetic task, saved locally.

What it is. ``bootstrap_tiny_model(cfg, out_dir, seed=...)`` writes a Hugging Face ``save_pretrained``
directory (``config.json``, ``generation_config.json``, ``model.safetensors``, tokenizer files) of a
``LlamaForCausalLM`` of about 0.6M parameters (defaults: hidden 128, MLP 256, 4 layers, 4 heads,
2 KV heads, tied embeddings) with the per-character tokenizer of ``rollflow.models.tokenizer``. No hub is touched.

The warm start is supervised: ``cfg.warm_start_steps`` AdamW steps on the prompts of one synthetic
task family (``task``, from ``dataset.synthetic.task``; ``rollflow.data.tasks``), drawn from the
family's ``warm_start_pool()`` - never a held-out problem - with the loss on the completion tokens only.

* ``add_habit`` (default): the whole train pool of ``a+b=``. For the first
  ``cfg.warm_start_clean_fraction`` of the steps the labels are right (the sum is learnt about twice as
  fast without label noise); after that they are right with probability ``cfg.warm_start_p_correct``
  and otherwise the sum + 1 (the off-by-one habit; never on problems with a round operand). Trained
  to the loss floor, the model knows both the sum and the habit: greedy decoding says the sum + 1,
  sampling finds the right answer often enough for GRPO to learn from.
* ``add_gap`` / ``shift_gap``: right labels only, on the family's support (no operand in 40-59; no
  shift of 4 or 5); the held-out problems lie outside it. The two ``add_habit`` knobs are unused.

* ``tool_lookup``: whole conversations (``warm_start_example``), the tool always used for the clean
  phase, then the ``unknown`` habit. The task declares a probe of its two copies
  (``rollflow.models.warm_start_probe``): at the end of the clean phase, while the probe fails, clean
  steps continue, up to ``cfg.warm_start_probe_extra_steps``; the marker records every probe.

Figures for every family: ``python -m bench.task_check --task NAME``.

Guarantees:

* **Deterministic**: the same ``(cfg, seed)`` gives byte-identical ``model.safetensors`` on one
  machine and torch build (model init and data come from seeded generators; the global RNG state
  is restored afterwards).
* **Idempotent**: a marker file ``rollflow_bootstrap.json``, written last, records the config, task,
  seed and recipe version; a second call with the same inputs returns at once, a different one rebuilds.
* **Atomic**: everything is written into a temporary sibling directory, then renamed into place, so
  a half-written directory is never taken for a finished one. An existing directory without our
  marker is not overwritten (it may hold someone's model): that raises ``FileExistsError``.

What it is not: a trainer for anything but this warm start (RL happens in ``rollflow.training``).

Run it::

    python -m rollflow.models.bootstrap --out runs/models/tiny [--task add_gap] [--seed 1] [--steps 500] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rollflow.api.config import ExperimentConfig, SyntheticTaskName, TinyModelConfig
from rollflow.data.synthetic import reasoning_gym_key, task_module
from rollflow.data.tasks import SyntheticProblem
from rollflow.models.tokenizer import CHARACTERS, build_tokenizer
from rollflow.models.warm_start_probe import ProbeResult, probe, probe_examples

logger = logging.getLogger(__name__)

MARKER = "rollflow_bootstrap.json"
RECIPE_VERSION = 3  # bump when a task, the tokenizer or the warm-start recipe changes: old dirs rebuild
DEFAULT_TASK: SyntheticTaskName = "add_habit"
_WARMUP_STEPS = 30
PROBE_EVERY = 50  # clean steps between two warm-start probes while the probe fails


def tiny_llama_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """The Llama architecture of the tiny model (Llama, not Qwen2: see notes/stack.md section 6)."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size or 2 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _encode_problems(tokenizer: PreTrainedTokenizerFast, problems: list[SyntheticProblem]) -> list[list[int]]:
    """Chat-rendered prompt ids per problem (``add_habit``'s all have one length; others vary).

    The template is rendered once; each problem's characters are spliced into it, which is what
    rendering per problem gives (checked on the first and the last) at a fraction of the cost.
    """

    def render(text: str) -> list[int]:
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )

    probe = problems[0].text
    template = render(probe)
    content = tokenizer.encode(probe, add_special_tokens=False)
    start = next(i for i in range(len(template)) if template[i : i + len(content)] == content)
    prefix, suffix = template[:start], template[start + len(content) :]
    char_ids = {c: tokenizer.convert_tokens_to_ids(c) for c in sorted({c for p in problems for c in p.text})}
    rows = [prefix + [char_ids[c] for c in p.text] + suffix for p in problems]
    if rows[-1] != render(problems[-1].text):
        raise AssertionError("spliced prompt ids differ from the chat template's")
    return rows


class _WarmStartData:
    """Samples warm-start batches: prompt ids, then completion ids, right-padded to ``[B, P + C]``.

    ``P`` is the task's longest prompt and ``C`` its longest label + ``<|im_end|>``, so every batch has
    one shape. A shorter prompt's completion follows it directly and the padding goes at the end:
    causal attention never looks ahead, so no attention mask is needed and positions count from the
    first token, as when the prompt is generated from (left-padded prompts get position ids from
    their attention mask). For ``add_habit`` (prompts of one length) this is exactly the original
    ``[prompt | completion | pad]`` layout, so its weights do not change.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerFast, task: SyntheticTaskName, p_correct: float, seed: int
    ) -> None:
        self.task = task_module(task)
        self.problems = list(self.task.warm_start_pool())  # never a held-out problem
        self.prompt_ids = _encode_problems(tokenizer, self.problems)
        self.prompt_len = max(len(ids) for ids in self.prompt_ids)
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.char_ids = {c: tokenizer.convert_tokens_to_ids(c) for c in CHARACTERS}
        self.p_correct = p_correct
        stream = (
            f"rollflow-warm-start:{seed}" if task == DEFAULT_TASK else f"rollflow-warm-start:{task}:{seed}"
        )
        self.rng = random.Random(stream)
        self.completion_len = self.task.MAX_ANSWER_CHARS + 1  # label + <|im_end|> (add_habit: 4)
        # A multi-turn family (tool_lookup) renders whole conversations: (ids, loss mask) per example.
        self.example = self.task.warm_start_example
        self.tokenizer = tokenizer

    def batch(self, size: int, p_correct: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids [B, P + C], loss_mask [B, P + C])``; the mask covers the completion only."""
        rng = self.rng
        if self.example is not None:
            pairs = [
                self.example(self.problems[rng.randrange(len(self.problems))], rng, p_correct, self.tokenizer)
                for _ in range(size)
            ]
            width = max(len(ids) for ids, _ in pairs)
            return (
                torch.tensor([ids + [self.pad] * (width - len(ids)) for ids, _ in pairs], dtype=torch.long),
                torch.tensor([m + [0] * (width - len(m)) for _, m in pairs], dtype=torch.long),
            )  # [B, longest] x 2, right-padded
        width = self.prompt_len + self.completion_len
        rows, masks = [], []
        for _ in range(size):
            index = rng.randrange(len(self.problems))
            label = self.task.warm_start_label(self.problems[index], rng, p_correct)
            prompt = self.prompt_ids[index]
            completion = [self.char_ids[c] for c in label] + [self.eos]
            pad = width - len(prompt) - len(completion)
            rows.append(prompt + completion + [self.pad] * pad)
            masks.append([0] * len(prompt) + [1] * len(completion) + [0] * pad)
        return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.long)  # [B, P + C] x 2


def warm_start(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    cfg: TinyModelConfig,
    *,
    seed: int,
    task: SyntheticTaskName = DEFAULT_TASK,
) -> dict[str, Any]:
    """Supervised warm start on a synthetic task family (see the module docstring). Returns loss figures.

    Labels (add_habit): right answers for ``step < warm_start_clean_fraction * steps``, then the habit
    mix. The other families' labels are always right.

    Loss per step, over completion tokens ``t`` only (``m_t`` = loss mask)::

        L = - sum_t m_t log p(x_t | x_<t) / sum_t m_t

    LR: linear warm-up over 30 steps, then cosine from ``warm_start_lr`` down to 10% of it.
    Right padding after ``<|im_end|>`` needs no attention mask: causal attention never looks ahead.

    Probe (a task that declares ``warm_start_probe``; ``rollflow.models.warm_start_probe``): at the end
    of the clean phase the probe runs; while it fails, clean steps continue at the lr reached, in
    chunks of ``PROBE_EVERY``, up to ``cfg.warm_start_probe_extra_steps`` (the cosine schedule waits),
    then the habit phase follows as planned. The probe runs again at the end. The returned figures
    then hold ``probe_extra_steps`` and every probe's result. Tasks without a probe train exactly as
    before (the probe draws from its own stream, so the data stream is untouched).
    """
    data = _WarmStartData(tokenizer, task, cfg.warm_start_p_correct, seed)
    least = data.task.MIN_WARM_START_STEPS
    if 0 < cfg.warm_start_steps < least:
        logger.warning(
            "model.tiny.warm_start_steps=%d is below the %d steps the synthetic task %s needs to be learnt "
            "reliably; the RL demo may not climb. Set model.tiny.warm_start_steps=%d.",
            cfg.warm_start_steps,
            least,
            task,
            least,
        )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr, betas=(0.9, 0.98), weight_decay=0.0)
    steps = cfg.warm_start_steps
    clean_steps = min(steps, math.ceil(cfg.warm_start_clean_fraction * steps))  # steps s < fraction * steps
    probe_fn = data.task.warm_start_probe
    examples = probe_examples(probe_fn, tokenizer, task) if probe_fn is not None else []
    probes: list[ProbeResult] = []
    losses: list[float] = []  # one per optimizer step taken, extra steps included

    def run_probe() -> ProbeResult:
        pass_at = data.task.WARM_START_PROBE_PASS
        result = probe(model, examples, step=len(losses), pad_id=data.pad, pass_at=pass_at)
        probes.append(result)
        logger.info("warm-start probe (%s), %s", task, result)
        return result

    def train_step(lr: float, p_correct: float) -> float:
        for group in opt.param_groups:
            group["lr"] = lr
        input_ids, loss_mask = data.batch(cfg.warm_start_batch_size, p_correct)
        logits = model(input_ids=input_ids).logits[:, :-1]  # [B, T-1, V] predicts tokens 1..T-1
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), input_ids[:, 1:].reshape(-1), reduction="none"
        ).view_as(input_ids[:, 1:])  # [B, T-1]
        mask = loss_mask[:, 1:].float()  # [B, T-1]
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    def scheduled_lr(step: int) -> float:
        warm = min(1.0, (step + 1) / _WARMUP_STEPS)
        cosine = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * step / steps))
        return cfg.warm_start_lr * warm * cosine

    model.train()
    extra = 0
    for step in range(steps):
        if examples and step == clean_steps > 0:  # the clean phase is over: are its lessons learnt?
            extra = _train_until_probe_passes(
                lambda: losses.append(train_step(scheduled_lr(clean_steps - 1), 1.0)),
                run_probe,
                cfg.warm_start_probe_extra_steps,
                task,
            )
        clean = step < clean_steps  # curriculum: the sum (the tool and the copies) first, then the habit
        losses.append(train_step(scheduled_lr(step), 1.0 if clean else cfg.warm_start_p_correct))
        if (step + 1) % 100 == 0:
            logger.debug("warm start step %d/%d loss %.4f", step + 1, steps, losses[-1])
    if examples:
        run_probe()  # after the habit: the copies, where the tool is called
    model.eval()
    tail = losses[-20:] or [float("nan")]
    stats: dict[str, Any] = {
        "final_loss": sum(tail) / len(tail),
        "first_loss": losses[0] if losses else float("nan"),
    }
    if examples:
        stats |= {"probe_extra_steps": extra, "probes": [r.as_dict() for r in probes]}
    return stats


def _train_until_probe_passes(
    train_step: Callable[[], None], run_probe: Callable[[], ProbeResult], budget: int, task: str
) -> int:
    """Probe; while it fails, train ``PROBE_EVERY`` more steps and probe again, at most ``budget``
    steps in all. Returns the steps added. Still failing at the end is logged, not raised: the
    marker records the probes, and RL on such a model may plateau (docs/benchmarks.md, "An agent learns a tool")."""
    extra = 0
    result = run_probe()
    while not result.passed and extra < budget:
        for _ in range(min(PROBE_EVERY, budget - extra)):
            train_step()
            extra += 1
        result = run_probe()
    if not result.passed:
        logger.warning(
            "the warm-start probe of task %s still fails after %d extra steps (%s); RL may not climb. "
            "Raise model.tiny.warm_start_probe_extra_steps or try another seed.",
            task,
            extra,
            result,
        )
    return extra


def marker_key(cfg: TinyModelConfig, seed: int, task: SyntheticTaskName = DEFAULT_TASK) -> dict[str, Any]:
    """What makes a bootstrap directory current: the config, the task, the seed and the recipe version."""
    return {"recipe_version": RECIPE_VERSION, "seed": seed, "task": task, "tiny": dataclasses.asdict(cfg)}


def _holds(marker: dict[str, Any] | None, key: dict[str, Any]) -> bool:
    """Whether a directory with ``marker`` is the finished build of ``key``."""
    return marker is not None and marker.get("key") == key


def read_marker(out_dir: str | Path) -> dict[str, Any] | None:
    """The marker of a finished bootstrap directory, or None."""
    path = Path(out_dir) / MARKER
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _build(cfg: TinyModelConfig, target: Path, seed: int, task: SyntheticTaskName) -> dict[str, Any]:
    """Write the model, tokenizer and marker into ``target`` (a fresh directory)."""
    t0 = time.monotonic()
    tokenizer = build_tokenizer(model_max_length=cfg.max_position_embeddings)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_llama_config(cfg, tokenizer))
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = model.config.bos_token_id
        stats = warm_start(model, tokenizer, cfg, seed=seed, task=task) if cfg.warm_start_steps > 0 else {}
    with _no_progress_bar():  # transformers draws a "Writing model shards" bar even into a log file
        model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    seconds = time.monotonic() - t0
    marker = {
        "key": marker_key(cfg, seed, task),
        "architecture": "LlamaForCausalLM",
        "params": sum(p.numel() for p in model.parameters()),
        "weights_sha256": _sha256(target / "model.safetensors"),
        "warm_start": {**stats, "steps": cfg.warm_start_steps, "seconds": round(seconds, 2)},
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    (target / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")  # last: "done"
    logger.info(
        "tiny model (%s): %d params, warm start %d steps, final loss %.4f, %.1f s",
        task,
        marker["params"],
        cfg.warm_start_steps,
        stats.get("final_loss", float("nan")),
        seconds,
    )
    return marker


def bootstrap_tiny_model(
    cfg: TinyModelConfig,
    out_dir: str | Path,
    *,
    seed: int,
    threads: int | None = 1,
    task: SyntheticTaskName = DEFAULT_TASK,
) -> Path:
    """Build (or find) the tiny model directory for ``(cfg, seed, task)`` at ``out_dir``; returns its path.

    ``task``: the synthetic task family to warm-start on (``dataset.synthetic.task``); a directory
    built for another task is rebuilt.

    ``threads``: torch intra-op threads for the build, restored afterwards (None: leave as is). One
    thread is the default because this model's matrices are too small to gain from more, and two
    threads next to any other busy process on a 2-core machine run several times slower (OpenMP
    threads spin-waiting for a core). The weights do not depend on it.

    Raises:
        FileExistsError: ``out_dir`` exists, is not empty and holds no bootstrap marker.
        ValueError: an unknown ``task``.
    """
    task_module(task)  # an unknown name fails here, before anything is touched
    out = Path(out_dir).resolve()
    key = marker_key(cfg, seed, task)
    marker = read_marker(out)
    if _holds(marker, key):
        logger.debug("tiny model at %s is current (task %s, seed %d); not rebuilding", out, task, seed)
        return out
    if out.exists() and marker is None and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} exists and is not a rollflow tiny-model directory (no {MARKER}); remove it or choose "
            "another model.path"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    saved_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        _build(cfg, tmp, seed, task)
        old = None
        if out.exists():  # ours, with another key (or empty): move aside, then swap in
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            # Another process finished the same build first; keep theirs if it is what we want.
            theirs = read_marker(out)
            if theirs is None or theirs.get("key") != key:
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        torch.set_num_threads(saved_threads)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollflow.models.bootstrap", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument(
        "--task",
        default=DEFAULT_TASK,
        choices=get_args(SyntheticTaskName),
        help=f"synthetic task family to warm-start on (default {DEFAULT_TASK})",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of init and warm-start data (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="override model.tiny.warm_start_steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the build (default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = TinyModelConfig()
    if args.steps is not None:
        cfg = dataclasses.replace(cfg, warm_start_steps=args.steps)
    path = bootstrap_tiny_model(cfg, args.out, seed=args.seed, threads=args.threads, task=args.task)
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _experiment_task(cfg: ExperimentConfig) -> Any:
    """The task an experiment's tiny model is warm-started for (a reasoning-gym task: its easier setting)."""
    if cfg.dataset.kind == "reasoning_gym":
        return reasoning_gym_key(cfg.dataset.reasoning_gym)
    return cfg.dataset.synthetic.task


def bootstrap_for(cfg: ExperimentConfig) -> Path:
    """The tiny model of an experiment: its tiny-model settings and seed, warm-started for the task its
    dataset trains on (``dataset.synthetic.task``), at ``model.path``."""
    return bootstrap_tiny_model(cfg.model.tiny, cfg.model.path, seed=cfg.seed, task=_experiment_task(cfg))


def current_tiny_model(cfg: ExperimentConfig) -> Path | None:
    """``model.path`` when it already holds the build ``bootstrap_for(cfg)`` would make (same marker key),
    else None. Finds only: never builds, moves or removes anything."""
    out = Path(cfg.model.path).resolve()
    return (
        out if _holds(read_marker(out), marker_key(cfg.model.tiny, cfg.seed, _experiment_task(cfg))) else None
    )
