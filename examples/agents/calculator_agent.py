"""A calculator agent, written as you would write it for any OpenAI-compatible provider.

What it is: plain ``openai`` client code with one function tool (``add``). The model is asked a
question; when it calls ``add`` the agent runs the tool and sends the result back; the model's final
text is compared with the expected answer, and that is the reward. Nothing here imports rollflow:
rollflow hands the agent a ``base_url`` and an ``api_key`` per episode, records every call the model
answers, and trains on exactly the tokens it generated (docs/agents.md).

Train it with rollflow::

    rollout:
      workflow: rollflow.workflows.agent:AgentWorkflow
      workflow_kwargs: {agent: examples.agents.calculator_agent:agent, max_turns: 8}

    # dataset rows: {"prompt_id": ..., "question": "What is 12+35?", "answer": "47"}

Run it against any endpoint (an OpenAI-compatible server, or a rollflow episode's base_url)::

    python examples/agents/calculator_agent.py --base-url http://127.0.0.1:8000/v1 --api-key KEY \
        --question "What is 12+35?" --answer 47

What it is not: a good calculator (that is the point: the policy learns when and how to call the tool).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from openai import AsyncOpenAI

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
MAX_STEPS = 6


def add(a: Any, b: Any) -> str:
    """The tool. Bad arguments are an answer the model must learn from, not an exception."""
    try:
        return str(int(a) + int(b))
    except (TypeError, ValueError):
        return f"error: add needs two integers, got a={a!r}, b={b!r}"


def run_tool(name: str, arguments: str) -> str:
    if name != "add":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON ({exc})"
    if not isinstance(args, dict):
        return "error: arguments must be an object"
    return add(args.get("a"), args.get("b"))


async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    """Answer ``data["question"]`` with the calculator; reward 1.0 when the final answer is ``data["answer"]``."""
    messages: list[Any] = [{"role": "user", "content": data["question"]}]
    answer = ""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        for _ in range(MAX_STEPS):
            response = await client.chat.completions.create(
                model="policy", messages=messages, tools=[ADD_TOOL], max_tokens=96
            )
            message = response.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                answer = (message.content or "").strip()
                break
            for call in message.tool_calls:
                result = run_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 1.0 if answer == str(data["answer"]).strip() else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--question", default="What is 12+35?")
    parser.add_argument("--answer", default="47")
    args = parser.parse_args()
    reward = asyncio.run(
        agent(args.base_url, args.api_key, {"question": args.question, "answer": args.answer})
    )
    print(f"reward {reward}")


if __name__ == "__main__":
    main()
