"""RLVRWorkflow: single-turn reinforcement learning from verifiable rewards, one group per prompt.

What it is: for one dataset row ``{"prompt_id", "messages", "answer", ...}`` it applies the tokenizer's
chat template (``add_generation_prompt=True``), runs ``group_size`` samples through the ``InferenceClient``
(one batched request when the client can batch), scores the completions (one reward-worker round trip)
with the reward function (in a process pool, with a timeout: a reward that raises or hangs scores 0 and
is counted, see ``rollflow.workflows.scoring``), and returns one ``TrajectoryGroup``. A sample whose
reward worker died (``infra_error``: no score at all, not a score of 0) drops its whole group, counted
as ``groups_dropped_reward_infra``: reward infrastructure is not a training signal. Each row is
``prompt + completion`` with, per token (``[T] = [P + O]``):

    loss_mask = [0] * P + [1] * O          # train on the model's tokens only
    logprobs  = [0.0] * P + behaviour_logp  # as sampled by the server
    versions  = [-1] * P + output_versions  # one trajectory may span several policy versions

Grouped rollout: a sample the client gave up on (``finish_reason == "abort"``) is dropped from its
group; a group whose samples are all dropped is rejected (the episode returns None).

The episode is a composition of the building blocks (``rollflow.workflows.blocks``): encode the prompt,
generate the samples, score them, build a row each, merge them into a group.

What it is not: the scheduler (``rollflow.rollout.executor``) or the reward functions themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.inference import InferenceClient, SamplingParams
from rollflow.api.rewards import RewardFn, RewardScorer
from rollflow.api.tokenizer import ChatTokenizer
from rollflow.api.workflow import RolloutWorkflow, import_string
from rollflow.workflows.blocks import (
    TokenTrace,
    decode,
    encode_prompt,
    generate_samples,
    load_tokenizer,
    merge_samples,
    sampling_from,
)
from rollflow.workflows.scoring import RewardScoring
from storage.schema import TrajectoryGroup


class RLVRWorkflow(RolloutWorkflow):
    """Single-turn RLVR: ``group_size`` concurrent samples per prompt, each scored by ``reward_fn``."""

    def __init__(
        self,
        reward_fn: str | RewardFn | Callable[..., float],
        tokenizer: ChatTokenizer | str,
        sampling: SamplingParams | dict[str, Any] | None = None,
        group_size: int = 8,
        *,
        reward_runner: RewardScorer | None = None,
        reward_workers: int = 2,
        reward_timeout_s: float = 10.0,
    ) -> None:
        """
        Args:
            reward_fn: ``fn(prompt, completion, answer, **data) -> float`` or its import string.
            tokenizer: a Hugging Face tokenizer with a chat template, or its directory.
            sampling: sampling parameters of every sample.
            group_size: samples per prompt (GRPO's group).
            reward_runner: a ready scorer; default: an ``AsyncRewardRunner`` over ``reward_fn`` with
                ``reward_workers`` processes and ``reward_timeout_s`` (threads of this process for a
                reward registered in-process, ``rollflow.rewards.inprocess``).
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.reward_fn = import_string(reward_fn) if isinstance(reward_fn, str) else reward_fn
        self.tokenizer = load_tokenizer(tokenizer)
        self.sampling = sampling_from(sampling)
        self.group_size = group_size
        self.scoring = RewardScoring(
            reward_fn, reward_runner, workers=reward_workers, timeout_s=reward_timeout_s
        )
        self.reward_runner = self.scoring.runner
        self.reward_counts = self.scoring.counts

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        prompt_id, messages = str(data["prompt_id"]), list(data["messages"])
        prompt_ids = encode_prompt(self.tokenizer, messages)
        results = await generate_samples(client, prompt_ids, self.sampling, self.group_size)
        done = [res for res in results if res.finish_reason != "abort"]  # the client gave up on the rest
        self.reward_counts.dropped_samples += len(results) - len(done)
        completions = [decode(self.tokenizer, res.output_ids) for res in done]
        try:
            scored = await self.scoring.ascore_many(messages, completions, data)
        except RewardInfrastructureError as exc:
            self.scoring.drop_group(prompt_id, exc)
            return None
        samples = [
            [
                TokenTrace.of_prompt(prompt_ids)
                .add_output(res)
                .to_row(prompt_id, reward=score, finish_reason=res.finish_reason, extra=info)
            ]
            for res, (score, info) in zip(done, scored, strict=True)
        ]
        return merge_samples(prompt_id, samples)

    def metrics(self) -> dict[str, float]:
        return self.reward_counts.as_metrics()

    def close(self) -> None:
        """Stop the reward process pool this workflow started."""
        self.scoring.close()
