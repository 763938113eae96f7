"""200 agent episodes at once on one endpoint and one CPU server: no call is recorded in another episode.

50 dataset rows x ``group_size`` 4, all started together. Each agent picks a random tag, writes it into
both of its user turns (the second after all 200 made their first call), and remembers it under its own episode id (read from its ``base_url``). Then:
every engine request went out under the rid of the episode whose key made it; every row holds its own
agent's tag and no other; each episode recorded exactly its two calls.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import openai

from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.inference.client import EngineClient
from rollflow.workflows.agent import AgentWorkflow

TAGS: dict[str, str] = {}  # episode id -> the tag its agent chose
N_EPISODES = 200
FIRST_CALLS_DONE: list[int] = [0]
ALL_FIRST_CALLS_DONE: dict[str, asyncio.Event] = {}
TAG = re.compile(r"tag([a-z]{8})")


async def tagged_agent(base_url: str, api_key: str, data: dict[str, Any]) -> float:
    episode = base_url.rstrip("/").split("/")[-2]  # .../episodes/<id>/v1
    tag = "".join(chr(ord("a") + int(c, 16) % 26) for c in uuid.uuid4().hex[:8])
    TAGS[episode] = tag
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oa:
        msgs: list[Any] = [{"role": "user", "content": f"row {data['row']} tag{tag}"}]
        r = await oa.chat.completions.create(model="m", messages=msgs, max_tokens=12)
        msgs += [r.choices[0].message, {"role": "user", "content": f"again tag{tag}"}]
        FIRST_CALLS_DONE[0] += 1  # every episode holds one call before any makes its second
        if FIRST_CALLS_DONE[0] == N_EPISODES:
            ALL_FIRST_CALLS_DONE["event"].set()
        await asyncio.wait_for(ALL_FIRST_CALLS_DONE["event"].wait(), 120)
        await oa.chat.completions.create(model="m", messages=msgs, max_tokens=12)
    return float(data["row"])


def test_200_concurrent_episodes_stay_isolated(tool_server: Any, tool_model_dir: Path) -> None:
    requests: list[tuple[GenerateRequest, GenerateResult]] = []

    async def go() -> tuple[list[Any], AgentWorkflow, int]:
        client = EngineClient(tool_server.addresses)
        real = client.agenerate

        async def spy(req: GenerateRequest) -> GenerateResult:
            res = await real(req)
            requests.append((req, res))
            return res

        client.agenerate = spy  # type: ignore[method-assign]
        FIRST_CALLS_DONE[0] = 0
        ALL_FIRST_CALLS_DONE["event"] = asyncio.Event()
        wf = AgentWorkflow(tagged_agent, str(tool_model_dir), {"max_new_tokens": 12}, group_size=4)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(wf.endpoint._by_key))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            groups = await asyncio.gather(
                *(wf.arun_episode(client, {"prompt_id": f"p{i}", "row": i}) for i in range(50))
            )
            return list(groups), wf, peak
        finally:
            watcher.cancel()
            await wf.aclose()
            await client.aclose()

    groups, wf, peak = asyncio.run(go())
    assert peak == N_EPISODES  # all episodes were open at once
    assert wf.counts.episodes_kept == 200 and wf.counts.calls == 400 and len(requests) == 400
    tok = wf.tokenizer
    by_rid: dict[str, list[tuple[GenerateRequest, GenerateResult]]] = {}
    for req, res in requests:
        episode = (req.rid or "").split("-")[0]
        by_rid.setdefault(episode, []).append((req, res))
        # The request holds the tag of the episode whose rid it carries, and only that one.
        assert TAG.findall(tok.decode(req.input_ids)) == [TAGS[episode]] * len(
            TAG.findall(tok.decode(req.input_ids))
        )
    assert len(by_rid) == 200 and all(len(calls) == 2 for calls in by_rid.values())
    seen: set[str] = set()
    for i, group in enumerate(groups):
        assert group is not None and len(group.rows) == 4
        for row in group.rows:
            episode = json.loads(row.extra)["agent_episode"]
            assert episode not in seen
            seen.add(episode)
            text = tok.decode(list(row.input_ids))
            assert TAG.findall(text) == [TAGS[episode], TAGS[episode]]  # its own tag, in both turns
            assert f"row {i} " in text and row.reward == float(i)
            req, res = by_rid[episode][-1]
            assert list(row.input_ids) == req.input_ids + res.output_ids
    assert seen == set(by_rid)
