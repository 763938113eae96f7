"""Rollout workflows: ``RLVRWorkflow`` (single turn), ``MultiTurnWorkflow`` (retry with feedback) and
``AgentWorkflow`` (a user's OpenAI-client agent, docs/agents.md), each a short composition of the
building blocks in ``blocks`` (encode, generate, build rows, merge) and ``scoring``. How to write one:
docs/workflows.md. See each module's docstring."""

from rollflow.workflows.agent import AgentWorkflow
from rollflow.workflows.multi_turn import MultiTurnWorkflow
from rollflow.workflows.rlvr import RLVRWorkflow

__all__ = ["AgentWorkflow", "MultiTurnWorkflow", "RLVRWorkflow"]
