"""A lookup agent, written as you would write it for any OpenAI-compatible provider.

What it is: plain ``openai`` client code with one function tool, ``lookup(key)``, that reads a table the
model cannot know (the row's ``table``). The model is asked for a key's code; when it calls ``lookup``
the agent runs the tool and sends the value back; the model's final text is compared with the
expected answer, and that is the reward. Nothing here imports rollflow. It is the agent of rollflow's
embedded agentic task (``configs/tiny_agent.yaml``, ``rollflow/data/tasks/tool_lookup.py``)::

    rollout:
      workflow: rollflow.workflows.agent:AgentWorkflow
      workflow_kwargs: {agent: examples.agents.lookup_agent:agent, tool_format: pythonic}

    # dataset rows: {"prompt_id": ..., "question": "code of K?", "table": {"K": "7"}, "answer": "7"}

Run it against any endpoint (an OpenAI-compatible server, or a rollflow episode's base_url)::

    python examples/agents/lookup_agent.py --base-url http://127.0.0.1:8000/v1 --api-key KEY

What it is not: a database client; the table travels with the row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from openai import AsyncOpenAI

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}
MAX_STEPS = 4


def run_tool(table: dict[str, str], name: str, arguments: str) -> str:
    """The tool. A bad call gets an answer the model can learn from, not an exception."""
    if name != "lookup":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    key = args.get("key") if isinstance(args, dict) else None
    return table.get(str(key), f"no key {key!r}")


async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    """Answer ``data["question"]`` with the lookup tool; reward 1.0 when the answer is ``data["answer"]``."""
    table, expected = data["table"], str(data["answer"]).strip()
    request: dict[str, Any] = {"model": "policy", "tools": [LOOKUP_TOOL], "max_tokens": 24}
    messages: list[Any] = [{"role": "user", "content": data["question"]}]
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        for _ in range(MAX_STEPS):
            reply = (await client.chat.completions.create(messages=messages, **request)).choices[0].message
            messages.append(reply)
            if not reply.tool_calls:  # the final answer
                return 1.0 if (reply.content or "").strip() == expected else 0.0
            for c in reply.tool_calls:
                result = run_tool(table, c.function.name, c.function.arguments)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    return 0.0  # never answered


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--base-url", required=True)
    cli.add_argument("--api-key", default="none")
    cli.add_argument("--key", default="K")
    cli.add_argument("--value", default="7")
    opts = cli.parse_args()
    row = {"question": f"code of {opts.key}?", "table": {opts.key: opts.value}, "answer": opts.value}
    print(f"reward {asyncio.run(agent(opts.base_url, opts.api_key, row))}")
