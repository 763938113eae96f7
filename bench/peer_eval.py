"""Scoring for the peer benchmark: greedy held-out accuracy of weight snapshots, and the curve summaries.

What it is: ``SnapshotScorer`` loads the run's starting model once, then for each snapshot (a
safetensors state dict written by ``bench/peer_trl.py`` or ``bench/peer_rollflow.py``) loads the weights
in place and decodes every held-out prompt greedily in one left-padded batch with ``model.generate``;
accuracy is the share of completions the task's reward scores >= 0.5. The prompts are rendered by the
model's own chat template and tokenized without adding special tokens, as rollflow's rollout and TRL
render them; the reward is called as rollflow calls it (``rollflow.rewards.protocol``): the last user
message, the completion decoded with special tokens skipped, the answer and the row's other fields;
a reward that raises scores 0. Both systems' snapshots go through this one function, so neither is
scored by its own code. Plus the pure curve functions the harness
prints: value at a time (or at the snapshot nearest a mark), first time a level is reached, medians, and ``base_split_accuracies``: retention
(accuracy on the held-out problems the starting model solved) and learning (on those it did not).

What it is not: the product's evaluation (``rollflow.evaluation`` scores whatever the inference servers
serve, mid-run); this one runs after the runs, off the training clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

Curve = list[tuple[float, float]]  # (training seconds, accuracy), sorted by time


class SnapshotScorer:
    """Greedy accuracy of weight snapshots of one model on fixed prompts."""

    def __init__(
        self,
        model_path: str | Path,
        rows: Sequence[dict[str, Any]],
        reward_fn: Callable[..., float],
        *,
        max_new_tokens: int,
        batch_size: int = 256,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.base = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.rows, self.reward_fn = list(rows), reward_fn
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        texts = [
            self.tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
            for r in rows
        ]
        # what the reward sees as `prompt`: the last user message, as in rollflow's rollout
        self.prompts = [
            next((m["content"] for m in reversed(r["messages"]) if m.get("role") == "user"), "") for r in rows
        ]
        self.data = [
            {k: v for k, v in r.items() if k not in ("prompt_id", "messages", "answer")} for r in rows
        ]
        self.enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def load(self, snapshot: str | Path | None) -> None:
        """The starting weights (None) or a snapshot's; a snapshot must cover every parameter."""
        sd = self.base if snapshot is None else load_file(str(snapshot))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise ValueError(
                f"snapshot {snapshot} does not fit the model: missing {missing}, extra {unexpected}"
            )

    def accuracy(self, snapshot: str | Path | None = None) -> float:
        correct = self.correct(snapshot)
        return sum(correct) / max(1, len(correct))

    @torch.no_grad()
    def correct(self, snapshot: str | Path | None = None) -> list[bool]:
        """Per held-out row, in order: did the snapshot's greedy completion score >= 0.5."""
        self.load(snapshot)
        correct: list[bool] = []
        for lo in range(0, len(self.rows), self.batch_size):
            texts = self._complete(lo, lo + self.batch_size, do_sample=False)  # one per row
            correct += [self.solves(i, text) for i, text in enumerate(texts, start=lo)]
        return correct

    @torch.no_grad()
    def solve_counts(self, k: int, temperature: float, *, seed: int = 0) -> list[int]:
        """Per held-out row, in order: how many of ``k`` completions sampled at ``temperature`` (from the
        starting weights) score >= 0.5. A GRPO group of ``k`` learns only from a row with 0 < count < k."""
        self.load(None)
        torch.manual_seed(seed)
        counts: list[int] = []
        step = max(1, self.batch_size // k)
        for lo in range(0, len(self.rows), step):
            texts = self._complete(
                lo,
                lo + step,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                num_return_sequences=k,
            )  # each row's k samples together
            counts += [
                sum(self.solves(i, t) for t in texts[j * k : (j + 1) * k])
                for j, i in enumerate(range(lo, min(lo + step, len(self.rows))))
            ]
        return counts

    def _complete(self, lo: int, hi: int, **sampling: Any) -> list[str]:
        """The loaded weights' completions of held-out rows ``lo:hi``, decoded without special tokens
        (``num_return_sequences`` of them per row, a row's together)."""
        ids = self.enc["input_ids"][lo:hi]  # [b, P]
        out = self.model.generate(
            input_ids=ids,
            attention_mask=self.enc["attention_mask"][lo:hi],
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.tok.eos_token_id,
            pad_token_id=self.tok.pad_token_id,
            **sampling,
        )  # [b * n, P + new]
        return self.tok.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)

    def solves(self, i: int, completion: str) -> bool:
        """Whether ``completion`` of held-out row ``i`` scores >= 0.5."""
        return self.score(self.prompts[i], completion, str(self.rows[i]["answer"]), self.data[i]) >= 0.5

    def score(self, prompt: str, completion: str, answer: str, data: dict[str, Any]) -> float:
        """The reward, or 0.0 when it raises or returns a non-number (rollflow's runner does the same)."""
        try:
            value = self.reward_fn(prompt, completion, answer, **data)
        except Exception:  # noqa: BLE001 - a reward that raises is a wrong answer, as in rollflow
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return 0.0
        return float(value)


def base_split_accuracies(correct: Sequence[bool], base: Sequence[bool]) -> tuple[float, float]:
    """(accuracy on the rows ``base`` got right, on the rows it got wrong); NaN for an empty half.

    solved = #{i: base_i and correct_i} / #{i: base_i}; unsolved = #{i: not base_i and correct_i} / #{i: not base_i}
    """
    if len(correct) != len(base):
        raise ValueError(f"{len(correct)} scores for {len(base)} base scores: not the same held-out rows")
    halves = (
        [c for c, b in zip(correct, base, strict=True) if b],
        [c for c, b in zip(correct, base, strict=True) if not b],
    )
    solved, unsolved = (sum(h) / len(h) if h else math.nan for h in halves)
    return solved, unsolved


def retention_by_step(run: dict[str, Any]) -> list[tuple[int, float, float]]:
    """(optimizer step, solved, unsolved) per snapshot of a ``bench.peer`` run: each retention point at the
    snapshot nearest its time; the start is step 0 (rollflow's runs list no snapshot there)."""
    snaps = [{"t": 0.0, "step": 0}, *run["snapshots"]]
    out = []
    for t, solved, unsolved in run["retention"]:
        step = min(snaps, key=lambda s: abs(s["t"] - t))["step"]
        out.append((int(step), float(solved), float(unsolved)))
    return out


def value_at(curve: Curve, t: float, *, final_from: float | None = None) -> float:
    """Accuracy of the last point at or before ``t`` (a run's state at that moment).

    ``final_from``: a run stops at the first step end past its budget, so its final point lies a
    fraction of a step after ``t``; with ``final_from=t`` that final point counts as the value at ``t``.
    """
    if final_from is not None and curve and curve[-1][0] >= final_from:
        return curve[-1][1]
    before = [a for s, a in curve if s <= t + 1e-9]
    return before[-1] if before else math.nan


def value_near(curve: Curve, t: float, *, within: float, final_from: float | None = None) -> float:
    """Accuracy of the snapshot nearest the mark ``t`` (a table's evaluation time); NaN if none is within
    ``within`` seconds of it. Ties go to the earlier snapshot; ``final_from`` as in ``value_at``.

    A snapshot is taken at a step end, a little after or before the time it was meant for, so "the last
    point at or before t" would read the snapshot of the previous mark whenever it lands late (a 30 s
    snapshot at 30.3 s makes acc@30s the 0 s score). The nearest one is the run at that mark; ``within``
    (``mark_window``) keeps a run without a snapshot near the mark from lending it another mark's value.
    """
    if final_from is not None and curve and curve[-1][0] >= final_from:
        return curve[-1][1]
    near = min(curve, key=lambda p: (abs(p[0] - t), p[0]), default=None)
    return near[1] if near is not None and abs(near[0] - t) <= within + 1e-9 else math.nan


def mark_window(marks: Sequence[float]) -> float:
    """How far from a mark ``value_near`` may look: half the smallest spacing between the marks, the start
    (0 s) counting as one. Marks 30, 60, 120, 180, 240 s: gaps 30, 30, 60, 60, 60 -> 15 s. So a snapshot
    read for a mark is at least as near to it as to any other mark."""
    points = sorted({0.0, *marks})
    gaps = [b - a for a, b in zip(points, points[1:], strict=False) if b > a]
    return min(gaps) / 2 if gaps else math.inf


def time_to(curve: Curve, level: float) -> float:
    """First time the curve is at or above ``level``; inf if never."""
    return next((s for s, a in curve if a >= level - 1e-12), math.inf)


def median(xs: Sequence[float]) -> float:
    finite = [x for x in xs if not math.isnan(x)]
    return statistics.median(finite) if finite else math.nan


def spread(xs: Sequence[float]) -> str:
    """``min..max`` for the printed summary."""
    finite = [x for x in xs if math.isfinite(x)]
    if not finite:
        return "none"
    return f"{min(finite):.3g}..{max(finite):.3g}"
