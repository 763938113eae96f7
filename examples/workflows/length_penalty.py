"""LengthPenaltyWorkflow: single-turn RLVR whose reward also pays for brevity (docs/workflows.md's example).

What it is: a complete rollout workflow, composed of rollflow's building blocks
(``rollflow.workflows.blocks``, ``rollflow.workflows.scoring``). For one dataset row it samples
``group_size`` completions of the prompt, scores each with the run's reward function
(``dataset.reward_fn``, in reward worker processes) and subtracts a penalty per generated token:

    reward = score - length_penalty * n_tokens / max_new_tokens

so that among right answers the shorter ones get the larger GRPO advantage. Beside the reward counters
it reports how many completions ran into the length cap (``completions_truncated``).

Use it::

    rollout:
      workflow: examples.workflows.length_penalty:LengthPenaltyWorkflow
      workflow_kwargs: {length_penalty: 0.2}

What it is not: part of rollflow; ``tests/rollout/test_workflows.py`` runs it end to end.
"""

from __future__ import annotations

from typing import Any

from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.inference import InferenceClient, SamplingParams
from rollflow.api.tokenizer import ChatTokenizer
from rollflow.api.workflow import RolloutWorkflow
from rollflow.workflows import blocks
from rollflow.workflows.blocks import TokenTrace
from rollflow.workflows.scoring import RewardScoring
from storage.schema import TrajectoryGroup, TrajectoryRow


class LengthPenaltyWorkflow(RolloutWorkflow):
    """Sample a group, score it with the run's reward, subtract a length penalty (module docstring)."""

    def __init__(
        self,
        reward_fn: str,
        tokenizer: ChatTokenizer | str,
        sampling: SamplingParams | dict[str, Any] | None = None,
        group_size: int = 8,
        *,
        length_penalty: float = 0.1,
        reward_workers: int = 2,
        reward_timeout_s: float = 10.0,
    ) -> None:
        """``build_workflow`` passes the standard arguments this signature names (``reward_fn``,
        ``tokenizer``, ``sampling``, ``group_size``, ``reward_workers``, ``reward_timeout_s``) from the
        config; ``length_penalty`` is this workflow's own and comes from ``rollout.workflow_kwargs``."""
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
        self.tokenizer = blocks.load_tokenizer(tokenizer)
        self.sampling = blocks.sampling_from(sampling)
        self.group_size = group_size
        self.length_penalty = length_penalty
        self.scoring = RewardScoring(reward_fn, workers=reward_workers, timeout_s=reward_timeout_s)
        self.truncated = 0

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        prompt_id, messages = str(data["prompt_id"]), list(data["messages"])
        prompt_ids = blocks.encode_prompt(self.tokenizer, messages)
        results = await blocks.generate_samples(client, prompt_ids, self.sampling, self.group_size)
        finished = [res for res in results if res.finish_reason != "abort"]  # aborted: the client gave up
        texts = [blocks.decode(self.tokenizer, res.output_ids) for res in finished]
        try:
            scored = await self.scoring.ascore_many(messages, texts, data)
        except RewardInfrastructureError as exc:  # no worker could score: not a reward of 0
            self.scoring.drop_group(prompt_id, exc)
            return None
        samples: list[list[TrajectoryRow] | None] = []
        for res, (score, info) in zip(finished, scored, strict=True):
            self.truncated += res.finish_reason == "length"
            penalty = self.length_penalty * len(res.output_ids) / self.sampling.max_new_tokens
            tokens = TokenTrace.of_prompt(prompt_ids).add_output(res)
            row = tokens.to_row(
                prompt_id,
                reward=score - penalty,
                finish_reason=res.finish_reason,
                extra={**info, "score": score},
            )
            samples.append([row])
        return blocks.merge_samples(prompt_id, samples)  # None (rejected) when every sample was aborted

    def metrics(self) -> dict[str, float]:
        return {**self.scoring.counts.as_metrics(), "completions_truncated": float(self.truncated)}

    def close(self) -> None:
        self.scoring.close()
