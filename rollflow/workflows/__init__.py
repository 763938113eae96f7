"""Rollout workflows: ``RLVRWorkflow`` (single turn), ``MultiTurnWorkflow`` (retry with feedback) and
``GroupedRolloutWorkflow`` (group any one-sample workflow). See each module's docstring."""

from rollflow.workflows.multi_turn import MultiTurnWorkflow
from rollflow.workflows.rlvr import GroupedRolloutWorkflow, RLVRWorkflow, merge_samples

__all__ = ["GroupedRolloutWorkflow", "MultiTurnWorkflow", "RLVRWorkflow", "merge_samples"]
