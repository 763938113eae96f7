"""MultiTurnWorkflow: answer, get told it is wrong, try again -- with a discount per extra turn.

What it is: a workflow whose every sample is a short conversation. After a turn whose score is below
``success_threshold`` the assistant's answer and a feedback user turn are appended and the model is
asked again, up to ``max_turns``. The final reward is

    reward = score(last turn) * turn_discount ** (n_turns - 1)

Every turn of a sample uses one rid, so the client keeps it on the same server (prefix KV reuse).

Tokens are never re-tokenized: the sequence is the exact tokens the model produced, joined by the
template's text between turns (closing the assistant turn, the feedback turn, the next generation
prompt), which is tokenized on its own (``blocks.turn_delta_ids``). Per token ``[T]``:

    loss_mask = 1 on the model's tokens of every turn, 0 on the prompt, template and feedback tokens
    versions  = the generating version on model tokens, -1 elsewhere; logprobs 0.0 where loss_mask = 0

Example, two turns (P prompt, O1/O2 outputs, E env delta): mask = [0]*P + [1]*O1 + [0]*E + [1]*O2.

A sample is a composition of the building blocks (``rollflow.workflows.blocks``): encode the prompt,
then per turn generate, score and, on a wrong answer, add the template delta; build the row; merge the
samples into a group. Scoring, aborted samples and a dead reward worker follow ``RLVRWorkflow``'s rules.

What it is not: a tool-calling agent (``AgentWorkflow``); it has no environment beyond the feedback
sentence.
"""

from __future__ import annotations

import asyncio
import uuid
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
    generate_turn,
    load_tokenizer,
    merge_samples,
    sampling_from,
    turn_delta_ids,
)
from rollflow.workflows.scoring import RewardScoring
from storage.schema import TrajectoryGroup, TrajectoryRow

DEFAULT_FEEDBACK = "Your answer is not correct. Please try to answer it again."


class MultiTurnWorkflow(RolloutWorkflow):
    """Retry after a wrong answer (see the module docstring)."""

    def __init__(
        self,
        reward_fn: str | RewardFn | Callable[..., float],
        tokenizer: ChatTokenizer | str,
        sampling: SamplingParams | dict[str, Any] | None = None,
        group_size: int = 8,
        *,
        max_turns: int = 2,
        turn_discount: float = 0.9,
        feedback: str = DEFAULT_FEEDBACK,
        success_threshold: float = 1.0,
        reward_runner: RewardScorer | None = None,
        reward_workers: int = 2,
        reward_timeout_s: float = 10.0,
    ) -> None:
        """
        Args:
            reward_fn, tokenizer, sampling, group_size, reward_runner, reward_workers, reward_timeout_s:
                as ``RLVRWorkflow``.
            max_turns: model turns per sample at most.
            turn_discount: the reward's factor per extra turn, in (0, 1].
            feedback: the user turn added after a wrong answer.
            success_threshold: a turn scoring at least this ends the sample.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0 < turn_discount <= 1:
            raise ValueError(f"turn_discount must be in (0, 1], got {turn_discount}")
        self.reward_fn = import_string(reward_fn) if isinstance(reward_fn, str) else reward_fn
        self.tokenizer = load_tokenizer(tokenizer)
        self.sampling = sampling_from(sampling)
        self.group_size = group_size
        self.max_turns, self.turn_discount = max_turns, turn_discount
        self.feedback, self.success_threshold = feedback, success_threshold
        self.scoring = RewardScoring(
            reward_fn, reward_runner, workers=reward_workers, timeout_s=reward_timeout_s
        )
        self.reward_runner, self.reward_counts = self.scoring.runner, self.scoring.counts

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        """``group_size`` concurrent multi-turn samples of one prompt, merged into one group."""
        prompt_id, messages = str(data["prompt_id"]), list(data["messages"])
        prompt_ids = encode_prompt(self.tokenizer, messages)
        results = await asyncio.gather(
            *(self.asample(client, data, messages, prompt_ids) for _ in range(self.group_size)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, RewardInfrastructureError):
                raise result
        lost = [r for r in results if isinstance(r, RewardInfrastructureError)]
        if lost:
            self.scoring.drop_group(prompt_id, lost[0])
            return None
        samples = [r for r in results if not isinstance(r, BaseException)]
        self.reward_counts.dropped_samples += sum(s is None for s in samples)
        return merge_samples(prompt_id, samples)

    async def asample(
        self,
        client: InferenceClient,
        data: dict[str, Any],
        messages: list[dict[str, str]],
        prompt_ids: list[int],
    ) -> list[TrajectoryRow] | None:
        """One conversation: its row, or None when the client gave up on a turn.

        Raises:
            RewardInfrastructureError: no reward worker could score a turn.
        """
        rid = uuid.uuid4().hex  # one rid for every turn: same server, reusable prefix cache
        history = list(messages)
        tokens = TokenTrace.of_prompt(prompt_ids)  # [T] exact tokens so far
        score, info, finish, completion, n_turns = 0.0, {}, "stop", "", 0
        for turn in range(self.max_turns):
            if turn > 0:
                feedback = [{"role": "user", "content": self.feedback}]
                tokens.add_context(
                    turn_delta_ids(
                        self.tokenizer, history, feedback,
                        last_output_token=tokens.input_ids[-1], stop_token_ids=self.sampling.stop_token_ids,
                    )
                )  # fmt: skip
                history += [{"role": "assistant", "content": completion}, *feedback]
            res = await generate_turn(client, tokens.input_ids, self.sampling, rid)
            if res.finish_reason == "abort":
                return None
            n_turns, finish = turn + 1, res.finish_reason
            tokens.add_output(res)
            completion = decode(self.tokenizer, res.output_ids)
            score, info = await self.scoring.ascore(messages, completion, data)
            if score >= self.success_threshold or not res.output_ids:
                break
        reward = score * self.turn_discount ** (n_turns - 1)
        extra = {**info, "last_turn_score": score}
        return [
            tokens.to_row(
                str(data["prompt_id"]), reward=reward, finish_reason=finish, n_turns=n_turns, extra=extra
            )
        ]

    def metrics(self) -> dict[str, float]:
        return self.reward_counts.as_metrics()

    def close(self) -> None:
        """Stop the reward process pool this workflow started."""
        self.scoring.close()
