"""Agent fixtures: a tiny model that has learnt to call a tool, and a real CPU server serving it.

The model is the per-character tokenizer of ``rollflow.models.tokenizer`` (printable ASCII, ChatML,
``<|im_end|>`` as EOS and end of turn) on a random 2-layer Llama, fine-tuned for a few hundred AdamW steps
on calculator conversations rendered exactly as the agent endpoint renders them (tools as a system
block, calls as ``<tool_call>{json}</tool_call>``)::

    system: Tools ... ; user: What is 12+35?  ->  assistant: <tool_call>{"name": "add", "arguments": {"a": 12, "b": 35}}</tool_call>
    tool: 47  ->  assistant: 47  ->  user: What is 8+4?  -> ...  (3 rounds)

The format tokens become near-certain; the digits stay uncertain, so teacher-forced logprobs are not all
~0 and the checks mean something. ``tool_model_dir_b`` continues the training a few steps (another
"version" with the same habits). Helpers of tests/rollout/conftest.py (``launch_cpu_servers``,
``teacher_forced_logprobs``) come through ``agent_lib``.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[1] / "rollout" / "conftest.py"
_NAME = "rollflow_tests_inference_fixtures"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _mod
    _spec.loader.exec_module(_mod)
_shared = sys.modules[_NAME]

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
ARCH: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}


def conversation(rng: random.Random, rounds: int = 3) -> list[dict[str, Any]]:
    """A calculator conversation in OpenAI form, the assistant's tool calls as raw text."""
    from rollflow.agents.tool_calls import tool_call_text

    msgs: list[dict[str, Any]] = []
    for _ in range(rounds):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        msgs += [
            {"role": "user", "content": f"What is {a}+{b}?"},
            {"role": "assistant", "content": tool_call_text("add", {"a": a, "b": b})},
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": str(a + b)},
        ]
    return msgs


def _example(prompter: Any, msgs: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Ids of the whole conversation and a mask on the assistant tokens (content + <|im_end|>)."""
    ids = prompter.encode(prompter.render(msgs, [ADD_TOOL], add_generation_prompt=False))
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start = len(prompter.encode(prompter.render(msgs[:i], [ADD_TOOL], add_generation_prompt=True)))
        end = len(prompter.encode(prompter.render(msgs[: i + 1], [ADD_TOOL], add_generation_prompt=False)))
        for t in range(start, end - 1):  # the template's "\n" after <|im_end|> is not the model's
            mask[t] = 1
    return ids, mask


def write_tool_model(
    path: Path, *, seed: int = 0, steps: int = 250, init: Path | None = None, batch: int = 4, lr: float = 1e-2
) -> Path:
    """Fine-tune (from ``init`` or random) on calculator conversations and save to ``path``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from rollflow.agents.chat_prompt import ChatPrompter
    from rollflow.models.random_llama import random_llama
    from rollflow.models.tokenizer import build_tokenizer

    tok = build_tokenizer(model_max_length=ARCH["max_position_embeddings"])
    prompter = ChatPrompter(tok)
    if init is None:
        model = random_llama(
            seed=seed, vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            bos_token_id=None, tie_word_embeddings=False, **ARCH,
        )  # fmt: skip
    else:
        model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr if init is None else lr / 3, weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    try:
        for step in range(steps):
            examples = [_example(prompter, conversation(rng, rng.randint(1, 3))) for _ in range(batch)]
            width = max(len(x) for x, _ in examples)
            ids = torch.tensor([x + [0] * (width - len(x)) for x, _ in examples])  # [B, T]
            mask = torch.tensor(
                [m + [0] * (width - len(m)) for _, m in examples], dtype=torch.float32
            )  # [B, T]
            logits = model(ids).logits[:, :-1]  # [B, T-1, V]
            nll = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), ids[:, 1:], reduction="none"
            )  # [B, T-1]
            loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
            for g in opt.param_groups:
                g["lr"] = g["lr"] if step >= 20 or init is not None else lr * (step + 1) / 20
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    (path / "rollflow_test_train.json").write_text(
        json.dumps({"steps": steps, "final_loss": float(loss.detach())})
    )
    return path


def _cached(name: str, build: Any) -> Path:
    """``build(path)`` once per recipe: the training is deterministic, so the result is kept in the temp
    dir under a hash of everything that shapes it (this file, the renderer, the tokenizer, torch)."""
    import hashlib
    import shutil
    import tempfile

    import torch

    import rollflow.agents.chat_prompt
    import rollflow.agents.tool_calls
    import rollflow.models.tokenizer

    h = hashlib.sha256(torch.__version__.encode())
    for mod_file in (__file__, rollflow.agents.tool_calls.__file__, rollflow.agents.chat_prompt.__file__,
                     rollflow.models.tokenizer.__file__):  # fmt: skip
        h.update(Path(mod_file).read_bytes())
    final = Path(tempfile.gettempdir()) / "rollflow-test-models" / f"tool-{name}-{h.hexdigest()[:16]}"
    if not (final / "rollflow_test_train.json").is_file():
        tmp = final.with_name(final.name + f".tmp{uuid.uuid4().hex[:8]}")
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another session finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@pytest.fixture(scope="session")
def tool_model_dir() -> Path:
    """The tool-calling tiny model ("version 0"); about 40 s to train the first time."""
    return _cached("v0", lambda p: write_tool_model(p, seed=0))


@pytest.fixture(scope="session")
def tool_model_dir_b(tool_model_dir: Path) -> Path:
    """``tool_model_dir`` trained 30 steps further: other weights, same habits ("version 1")."""
    return _cached("v1", lambda p: write_tool_model(p, seed=1, steps=30, init=tool_model_dir))


@pytest.fixture(scope="session")
def tool_server(tool_model_dir: Path) -> Iterator[Any]:
    """One CPU server serving ``tool_model_dir`` as weight_version "0" (tests must leave it so)."""
    with _shared.launch_cpu_servers(tool_model_dir, 1) as group:
        yield group


@pytest.fixture(scope="session")
def agent_lib() -> SimpleNamespace:
    return SimpleNamespace(
        ADD_TOOL=ADD_TOOL,
        launch_cpu_servers=_shared.launch_cpu_servers,
        teacher_forced_logprobs=_shared.teacher_forced_logprobs,
        teacher_forced_logits=_shared.teacher_forced_logits,
        conversation=conversation,
    )
