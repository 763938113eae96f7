"""Agentic RL: an OpenAI-compatible endpoint per episode that records the exact tokens an agent's calls
generated. ``AgentEndpoint`` (HTTP), ``EpisodeRecorder`` (calls, segments, limits, rows), ``ChatPrompter``
(prompt ids that extend the previous context), ``rollflow.agents.tool_calls`` (the ``<tool_call>``
convention). The workflow that runs a user's agent is ``rollflow.workflows.agent.AgentWorkflow``;
the user's guide is docs/agents.md."""

from rollflow.agents.chat_prompt import ChatPrompter
from rollflow.agents.counts import AgentCounts
from rollflow.agents.endpoint import AgentEndpoint, EpisodeHandle
from rollflow.agents.recorder import CallRecord, EpisodeLimits, EpisodeRecorder

__all__ = [
    "AgentCounts", "AgentEndpoint", "CallRecord", "ChatPrompter", "EpisodeHandle", "EpisodeLimits", "EpisodeRecorder",
]  # fmt: skip
