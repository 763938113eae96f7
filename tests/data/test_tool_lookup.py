"""Synthetic task tool_lookup: the fixed split, the rows the agent reads, and the warm start's conversations
rendered exactly as the agent endpoint renders the episode (so the warm start teaches the tokens RL sees).

The split sizes are pinned: the hash-chosen held-out keys must never move.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

from rollflow.agents.chat_prompt import ChatPrompter
from rollflow.agents.tool_calls import parse_tool_calls
from rollflow.api.config import SyntheticTaskConfig
from rollflow.configuration.loader import load_config
from rollflow.data.synthetic import synthetic_rows, task_module
from rollflow.data.tasks import tool_lookup
from rollflow.models.tokenizer import IM_END, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def example_agent() -> Any:
    spec = importlib.util.spec_from_file_location("lookup_agent", ROOT / "examples/agents/lookup_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_split_is_fixed_disjoint_and_complete() -> None:
    train, test = tool_lookup.problem_pool("train"), tool_lookup.problem_pool("test")
    assert (len(train), len(test)) == (200, 60)  # 26 keys x 10 digits, ~1/4 held out by hash
    assert not set(train) & set(test)
    assert tool_lookup.warm_start_pool() == train  # never a held-out problem
    assert task_module("tool_lookup") is tool_lookup
    rows = synthetic_rows(SyntheticTaskConfig(task="tool_lookup", n_train=10, n_eval=60), "test")
    assert {r["prompt_id"] for r in rows} == {f"synthetic-test-lookup-{p.key}{p.value}" for p in test}
    # A key's digit is the row's: the same question has other answers in other rows.
    assert len({p.value for p in train + test if p.key == "K"}) == 10


def test_rows_hold_the_question_and_a_table_with_the_answer() -> None:
    row = tool_lookup.problem_row(tool_lookup.LookupProblem("K", 7), "train")
    assert row["question"] == row["messages"][0]["content"] == "code of K?"
    assert row["table"]["K"] == row["answer"] == "7"
    assert len(row["table"]) == 1 + tool_lookup.N_DECOYS


def test_the_example_agent_offers_the_task_tool_and_reads_the_table() -> None:
    agent = example_agent()
    assert agent.LOOKUP_TOOL == tool_lookup.LOOKUP_TOOL  # the warm start rendered the agent's tool
    table = {"K": "7"}
    assert agent.run_tool(table, "lookup", '{"key": "K"}') == "7"
    assert agent.run_tool(table, "lookup", '{"key": "Z"}') == "no key 'Z'"
    assert agent.run_tool(table, "other", "{}").startswith("error: unknown tool")


def test_warm_start_conversations_are_the_endpoints_tokens() -> None:
    """The tool path's ids equal what the endpoint builds for the episode: turn 1's prompt + the model's
    call + the delta to turn 2 + the answer; the mask covers exactly the two replies and their <|im_end|>.
    The tool's value is drawn per example (nothing to memorise): both copies of it agree."""
    tok = build_tokenizer()
    prompter = ChatPrompter(tok, tool_format="pythonic")
    im_end = tok.convert_tokens_to_ids(IM_END)
    p = tool_lookup.problem_pool("train")[0]
    ids, mask = tool_lookup.warm_start_example(p, random.Random(0), 1.0, tok)
    value = tok.decode([t for t, m in zip(ids, mask, strict=True) if m][-2:-1])
    others = {tok.decode(tool_lookup.warm_start_example(p, random.Random(s), 1.0, tok)[0]) for s in range(30)}
    assert value.isdigit() and len(others) > 5  # a digit per example, not the problem's
    tools = [tool_lookup.LOOKUP_TOOL]
    first = [{"role": "user", "content": p.text}]
    prompt = prompter.full_ids(first, tools)
    call = prompter.encode(tool_lookup.call_text(p.key)) + [im_end]
    reply = parse_tool_calls(tool_lookup.call_text(p.key), turn=0, fmt="pythonic").message()
    assert reply["tool_calls"][0]["function"]["arguments"] == f'{{"key": "{p.key}"}}'
    then = [*first, reply, {"role": "tool", "tool_call_id": "call_0_0", "content": value}]
    delta = prompter.delta_ids(first, tools, reply, then, tools, last_token=im_end)
    assert delta is not None
    answer = prompter.encode(value) + [im_end]
    assert ids[:-1] == prompt + call + delta + answer  # the template's final "\n" is never generated
    assert [t for t, m in zip(ids, mask, strict=True) if m] == call + answer
    assert len(ids) < 90  # ~75 tokens an episode: what keeps the task fast on CPU
    habit, habit_mask = tool_lookup.warm_start_example(p, random.Random(0), 0.0, tok)
    assert tok.decode([t for t, m in zip(habit, habit_mask, strict=True) if m]) == "unknown" + IM_END


def test_tiny_agent_config_loads() -> None:
    cfg = load_config(ROOT / "configs/tiny_agent.yaml")
    assert cfg.dataset.synthetic.task == "tool_lookup"
    assert cfg.rollout.workflow == "rollflow.workflows.agent:AgentWorkflow"
    assert cfg.rollout.workflow_kwargs["agent"] == "examples.agents.lookup_agent:agent"
    assert "max_staleness" not in cfg.rollout.workflow_kwargs  # it comes from rollout.max_staleness
    assert cfg.dataset.synthetic.n_eval <= len(tool_lookup.problem_pool("test"))


def test_warm_start_probe_points_at_the_two_copies() -> None:
    """The probe's conversations are held-out keys rendered as the warm start renders them; ``key`` is the
    letter inside the call, ``digit`` the final answer, and the tool's message holds the same digit."""
    tok = build_tokenizer()
    rng = random.Random(0)
    held_out_keys = {p.key for p in tool_lookup.problem_pool("test")}
    for _ in range(20):
        ids, at = tool_lookup.warm_start_probe(rng, tok)
        text = tok.decode(ids)
        key, digit = tok.decode([ids[at["key"]]]), tok.decode([ids[at["digit"]]])
        assert key in held_out_keys and key.isupper() and digit.isdigit()
        assert tok.decode(ids[at["key"] - 6 : at["key"] + 3]) == f"(key='{key}')"
        assert f"code of {key}?" in text and f"tool\n{digit}{IM_END}" in text
        assert tok.decode(ids[at["digit"] - 10 : at["digit"] + 1]).endswith(f"assistant\n{digit}")
        assert at["digit"] == max(i for i, t in enumerate(ids) if t == ids[at["digit"]])
