"""Rollout workflows: ``RLVRWorkflow`` (single turn), ``MultiTurnWorkflow`` (retry with feedback),
``GroupedRolloutWorkflow`` (group any one-sample workflow) and ``AgentWorkflow`` (a user's OpenAI-client
agent, docs/agents.md). See each module's docstring."""

from rollflow.workflows.agent import AgentWorkflow
from rollflow.workflows.multi_turn import MultiTurnWorkflow
from rollflow.workflows.rlvr import GroupedRolloutWorkflow, RLVRWorkflow, merge_samples

__all__ = ["AgentWorkflow", "GroupedRolloutWorkflow", "MultiTurnWorkflow", "RLVRWorkflow", "merge_samples"]
