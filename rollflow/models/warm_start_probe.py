"""A warm-start probe: does the tiny model predict the tokens a task names (e.g. what it must copy)?

What it is. A synthetic task family may declare ``warm_start_probe(rng, tokenizer)``, returning one
example as ``(ids, targets)``: the token ids of a whole sequence and, per name, the index of a token
the model must predict (``{"key": 55, "digit": 71}`` for ``tool_lookup``: the key copied into the
tool call, the digit copied from the tool's message into the answer), and ``WARM_START_PROBE_PASS``,
the mean probability each name must reach. ``probe(model, examples)`` scores a fixed set of such examples,
teacher-forced, in one forward pass::

    accuracy[name] = mean_i 1[argmax_v p(v | x_i[:t_i]) == x_i[t_i]]     (greedy: is it right?)
    p[name]        = mean_i p(x_i[t_i] | x_i[:t_i])                      (how sure)

and passes when ``p[name] >= pass_at`` for every name: ``p`` is the chance that a sample at
temperature 1 (what RL draws) gets the token right. Greedy accuracy comes first and alone is not
enough: a measured key copy was greedy-right on every example at ``p`` 0.20.

``rollflow.models.bootstrap`` runs it at the end of the warm start's clean phase and, while it fails,
trains on (``model.tiny.warm_start_probe_extra_steps``); copying by attention appears after a
plateau whose length depends on the seed, which is what the probe guards against.

What it is not: an evaluation of the task (held-out success is ``rollflow.evaluation.agent``'s); the
probe has no sampling, no generation and no RNG of its own (its examples are drawn by the caller).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ProbeExample = tuple[list[int], dict[str, int]]  # (token ids, {name: index of the token to predict})
ProbeFn = Callable[[random.Random, Any], ProbeExample]
N_PROBE_EXAMPLES = 128
PROBE_SEED = "rollflow-warm-start-probe"  # one fixed set of examples per task, whatever the seed


@dataclass(frozen=True)
class ProbeResult:
    """The probe at one warm-start step: greedy accuracy and mean probability per named token;
    ``passed`` when every mean probability reaches the task's ``WARM_START_PROBE_PASS``."""

    step: int
    accuracy: dict[str, float]
    probability: dict[str, float]
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "accuracy": {k: round(v, 4) for k, v in self.accuracy.items()},
            "probability": {k: round(v, 4) for k, v in self.probability.items()},
            "passed": self.passed,
        }

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {self.accuracy[k]:.2f} (p {self.probability[k]:.2f})" for k in self.accuracy)
        return f"step {self.step}: {parts}: {'passed' if self.passed else 'not yet'}"


def probe_examples(
    make: ProbeFn, tokenizer: Any, task_name: str, n: int = N_PROBE_EXAMPLES
) -> list[ProbeExample]:
    """``n`` examples from the task's ``warm_start_probe``, drawn from a stream fixed per task."""
    rng = random.Random(f"{PROBE_SEED}:{task_name}")
    return [make(rng, tokenizer) for _ in range(n)]


def probe(
    model: torch.nn.Module, examples: list[ProbeExample], *, step: int, pad_id: int, pass_at: float
) -> ProbeResult:
    """Score ``examples`` teacher-forced (module docstring); the model is left in the mode it was in.

    Right padding needs no attention mask: causal attention never looks ahead, and every target
    lies inside its own example.
    """
    width = max(len(ids) for ids, _ in examples)
    ids = torch.tensor(
        [row + [pad_id] * (width - len(row)) for row, _ in examples], dtype=torch.long
    )  # [N, T]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logp = model(input_ids=ids).logits.log_softmax(-1)  # [N, T, V]
    model.train(was_training)
    names = list(examples[0][1])
    accuracy: dict[str, float] = {}
    probability: dict[str, float] = {}
    for name in names:
        rows = torch.arange(len(examples))  # [N]
        at = torch.tensor([targets[name] for _, targets in examples])  # [N] index of the target token
        want = ids[rows, at]  # [N]
        before = logp[rows, at - 1]  # [N, V] the prediction of token `at`
        accuracy[name] = (before.argmax(-1) == want).float().mean().item()
        probability[name] = before.gather(1, want[:, None]).exp().mean().item()
    return ProbeResult(step, accuracy, probability, passed=all(p >= pass_at for p in probability.values()))
