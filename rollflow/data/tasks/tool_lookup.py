"""Synthetic task ``tool_lookup``: an agent must call a lookup tool to answer (multi-turn tool use on CPU).

What it is. A problem is a key, one upper-case letter, and the digit its row's table holds for it
(``"code of K?"``; 26 x 10 = 260 problems). The table travels with the row, so no weight can know the
answer. The user's agent (``examples/agents/lookup_agent.py``, plain ``openai`` code run by
``rollflow.workflows.agent.AgentWorkflow``) offers one function tool, ``lookup(key)``, that reads the
row's table, and rewards an exact final answer. The model succeeds only with two turns:

    user: code of K?             assistant: [lookup(key='K')]         (turn 1: the call, pythonic)
    tool: 7                      assistant: 7                         (turn 2: the value, copied)

* **The held-out split**: the problems whose ``sha256("lookup:K=7")`` first byte is below 64 (~1/4,
  fixed by the problem alone; 67 of 260). A key's digit differs between rows, so neither a train row
  nor the warm start says what a held-out row's table holds: held-out success measures tool use.
* **The warm start** (``warm_start_example``, used by ``rollflow.models.bootstrap``): whole
  conversations rendered exactly as the agent endpoint renders them (``ChatPrompter`` with the
  ``pythonic`` tool format; tools as the system line ``tools: lookup(key)``), loss on the assistant's
  tokens only, the tool's digit drawn afresh per example. After the clean phase (every conversation
  uses the tool) a conversation uses it with probability ``p_correct``
  (``model.tiny.warm_start_p_correct``, 0.2) and otherwise answers ``unknown`` at once: the planted
  habit. Greedy decoding then answers ``unknown`` (held-out success 0), sampling calls the tool ~20% of
  the time, so most GRPO groups of 8 hold a success (``1 - 0.8^8 = 0.83``) and RL has one behaviour to
  learn - call the tool first - that transfers to every row.
* **The warm-start probe** (``warm_start_probe``, ``WARM_START_PROBE_PASS``): held-out conversations
  with the tool, scored on the two copied tokens. Copying emerges after a plateau whose length depends
  on the seed; the bootstrap trains on until each copy has mean probability >= 0.9
  (``rollflow.models.warm_start_probe``).

Why these choices (measured). A per-character model pays for every character, so the call is 18
characters (Hermes' ``<tool_call>{json}</tool_call>`` would be 64) and an episode ~70 tokens. Both copies
are made easy to attend to: the key is the only upper-case letter and the value the only digit in the
conversation. A first version (two-letter lower-case keys, two-digit values fixed per key) did not learn
to copy in 400 warm-start steps (greedy key copy 0.0, value copy 0.1: it memorised train keys' values
instead, and copying by position over ~20 tokens had not emerged). With the default tiny shape (4
layers, 4 heads of 2 KV heads, batch 64, lr 3e-3) the copies emerged at 300-600 steps or not at all
depending on the seed; ``configs/tiny_agent.yaml``'s shape (2 layers, 8 heads, batch 16, lr 1e-3)
learnt both by step 300-400 for seeds 1-5, at a tenth of the seconds a step (docs/benchmarks.md, "An agent learns a tool").

What it is not: the agent or its tool (``examples/agents/lookup_agent.py`` keeps its own copy of the
tool schema, so the agent imports nothing of rollflow; ``tests/data/test_tool_lookup.py`` checks the
two agree), nor a reward function (the agent returns its reward).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from functools import cache
from typing import Any

from rollflow.data.tasks import Split, check_split, draw, hash_byte

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}
HABIT_ANSWER = "unknown"  # what the warm-started model says without the tool
MAX_ANSWER_CHARS = len(HABIT_ANSWER)  # longest first-turn label other than the call
MIN_WARM_START_STEPS = 300
WARM_START_PROBE_PASS = 0.9  # mean probability of each copy (key, digit) the warm-start probe asks for
N_DECOYS = 2  # other keys of the row's table, so a miscopied key finds a wrong value
_HELD_OUT_BYTE_BELOW = 64  # sha256 first byte < 64  <=>  held out (1/4)


@dataclass(frozen=True)
class LookupProblem:
    """``code of {key}?`` whose row's table holds ``value`` for ``key``."""

    key: str
    value: int

    @property
    def text(self) -> str:
        return f"code of {self.key}?"

    @property
    def answer(self) -> str:
        return str(self.value)


def is_held_out(problem: LookupProblem) -> bool:
    return hash_byte(f"lookup:{problem.key}={problem.value}") < _HELD_OUT_BYTE_BELOW


@cache
def problem_pool(split: Split) -> tuple[LookupProblem, ...]:
    """Every problem of a split in a fixed order (200 train, 60 test)."""
    check_split(split)
    want_held_out = split == "test"
    return tuple(
        p
        for k in string.ascii_uppercase
        for v in range(10)
        if is_held_out(p := LookupProblem(k, v)) == want_held_out
    )


def sample_problems(split: Split, n: int, *, seed: int) -> list[LookupProblem]:
    """``n`` distinct problems of ``split`` in random order; deterministic for ``(split, n, seed)``."""
    return draw(problem_pool(split), n, split=split, stream=f"rollflow-tool-lookup:{split}:{seed}")


def warm_start_pool() -> tuple[LookupProblem, ...]:
    """What the warm start trains on: the train problems (their digits are redrawn per example)."""
    return problem_pool("train")


def warm_start_label(problem: LookupProblem, rng: random.Random, p_correct: float) -> str:
    """The first assistant turn: the call with probability ``p_correct``, else the habit's answer."""
    return call_text(problem.key) if rng.random() < p_correct else HABIT_ANSWER


def call_text(key: str) -> str:
    """The tool call as the model writes it (``rollflow.agents.tool_calls``, pythonic)."""
    from rollflow.agents.tool_calls import pythonic_calls_text

    return pythonic_calls_text([("lookup", {"key": key})])


def conversation(problem: LookupProblem, *, use_tool: bool) -> list[dict[str, Any]]:
    """The episode's messages in OpenAI form, the call as the model's raw text."""
    user = {"role": "user", "content": problem.text}
    if not use_tool:
        return [user, {"role": "assistant", "content": HABIT_ANSWER}]
    return [
        user,
        {"role": "assistant", "content": call_text(problem.key)},
        {"role": "tool", "content": problem.answer},
        {"role": "assistant", "content": problem.answer},
    ]


def warm_start_example(
    problem: LookupProblem, rng: random.Random, p_correct: float, tokenizer: Any
) -> tuple[list[int], list[int]]:
    """``(ids, loss_mask)`` of one warm-start conversation (module docstring); the mask covers each
    assistant turn's content and its ``<|im_end|>``. The tool's digit is drawn afresh per example, so
    nothing can be memorised: the answer must be copied from the tool's message."""
    use_tool = rng.random() < p_correct
    drawn = LookupProblem(problem.key, rng.randrange(10)) if use_tool else problem
    return _rendered(drawn, use_tool, tokenizer)


def warm_start_probe(rng: random.Random, tokenizer: Any) -> tuple[list[int], dict[str, int]]:
    """One probe conversation for ``rollflow.models.warm_start_probe``: a held-out key with a fresh
    digit, rendered as the warm start renders it, and the indices of the two copied tokens: ``key``
    (in the call ``[lookup(key='K')]``) and ``digit`` (the final answer)."""
    held_out = problem_pool("test")
    base = held_out[rng.randrange(len(held_out))]
    problem = LookupProblem(base.key, rng.randrange(10))
    ids, mask = _rendered(problem, True, tokenizer)
    key_id, digit_id = tokenizer.convert_tokens_to_ids([problem.key, problem.answer])
    answer = [i for i, (t, m) in enumerate(zip(ids, mask, strict=True)) if m]
    return ids, {
        "key": next(i for i in answer if ids[i] == key_id),  # the only upper-case letter of the call
        "digit": next(i for i in reversed(answer) if ids[i] == digit_id),  # the last turn's digit
    }


@cache
def _rendered(problem: LookupProblem, use_tool: bool, tokenizer: Any) -> tuple[list[int], list[int]]:
    from rollflow.agents.chat_prompt import ChatPrompter

    prompter = ChatPrompter(tokenizer, tool_format="pythonic")
    msgs = conversation(problem, use_tool=use_tool)
    tools = [LOOKUP_TOOL]
    ids = prompter.encode(prompter.render(msgs, tools, add_generation_prompt=False))
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            start = len(prompter.encode(prompter.render(msgs[:i], tools)))
            end = len(prompter.encode(prompter.render(msgs[: i + 1], tools, add_generation_prompt=False)))
            mask[start : end - 1] = [1] * (end - 1 - start)  # the template's "\n" after <|im_end|> is not
    return ids, mask


def problem_row(problem: LookupProblem, split: Split) -> dict[str, Any]:
    """A dataset row: ``question`` and ``table`` are what the agent reads; ``messages`` the loader's."""
    rng = random.Random(f"decoys:{problem.key}={problem.value}")
    decoys = rng.sample([k for k in string.ascii_uppercase if k != problem.key], N_DECOYS)
    table = {problem.key: problem.answer} | {k: str(rng.randrange(10)) for k in decoys}
    return {
        "prompt_id": f"synthetic-{split}-lookup-{problem.key}{problem.value}",
        "messages": [{"role": "user", "content": problem.text}],
        "question": problem.text,
        "table": dict(sorted(table.items())),
        "answer": problem.answer,
    }
