"""The calculator agent written with the OpenAI Agents SDK (``pip install openai-agents``).

What it is: an ``agents.Agent`` with one ``@function_tool``, run by ``agents.Runner`` on the Chat
Completions API of whatever ``base_url`` it is given. The SDK runs the tool loop itself; the reward is
1.0 when the final output is the expected answer. Nothing here imports rollflow; to train it, name it in
the config as ``examples.agents.sdk_calculator_agent:agent`` (docs/agents.md).

Run it against any OpenAI-compatible endpoint::

    python examples/agents/sdk_calculator_agent.py --base-url http://127.0.0.1:8000/v1 --api-key KEY

What it is not: a use of the Responses API or of OpenAI's hosted tools (rollflow's endpoint serves Chat
Completions), and tracing is off (it would try to upload traces to OpenAI).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


async def agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    """Answer ``data["question"]``; 1.0 when the final output is ``data["answer"]``."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key) as client:
        calculator = Agent(
            name="calculator",
            instructions="Answer with the result. Use the add tool for sums.",
            tools=[add],
            model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
            model_settings=ModelSettings(max_tokens=96),
        )
        try:
            result = await Runner.run(
                calculator, data["question"], max_turns=6, run_config=RunConfig(tracing_disabled=True)
            )
        except MaxTurnsExceeded:
            return 0.0
    return 1.0 if str(result.final_output).strip() == str(data["answer"]).strip() else 0.0


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
