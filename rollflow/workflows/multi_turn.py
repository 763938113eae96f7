"""MultiTurnWorkflow: answer, get told it is wrong, try again -- with a discount per extra turn.

What it is: ``RLVRWorkflow`` whose every sample is a short conversation. After a turn whose score is
below ``success_threshold`` the assistant's answer and a feedback user turn are appended and the model
is asked again, up to ``max_turns``. The final reward is

    reward = score(last turn) * turn_discount ** (n_turns - 1)

Every turn of a sample uses one rid, so the client keeps it on the same server (prefix KV reuse).

Tokens are never re-tokenized: the sequence is the exact tokens the model produced, joined by the
template's text between turns (closing the assistant turn, the feedback turn, the next generation
prompt), which is tokenized on its own. The template delta is found by rendering the conversation with a
sentinel as the assistant's content and taking what follows it. Per token ``[T]``:

    loss_mask = 1 on the model's tokens of every turn, 0 on the prompt, template and feedback tokens
    versions  = the generating version on model tokens, -1 elsewhere; logprobs 0.0 where loss_mask = 0

Example, two turns (P prompt, O1/O2 outputs, E env delta): mask = [0]*P + [1]*O1 + [0]*E + [1]*O2.

What it is not: a tool-calling agent; it has no environment beyond the feedback sentence.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.inference import GenerateRequest, InferenceClient
from rollflow.workflows.rlvr import RLVRWorkflow, check_result, merge_samples, render_chat
from storage.schema import TrajectoryGroup, TrajectoryRow

_SENTINEL = "\u2063ROLLFLOW-ASSISTANT-TURN\u2063"
DEFAULT_FEEDBACK = "Your answer is not correct. Please try to answer it again."


class MultiTurnWorkflow(RLVRWorkflow):
    """Retry after a wrong answer (see the module docstring). Other arguments as ``RLVRWorkflow``."""

    def __init__(
        self,
        *args: Any,
        max_turns: int = 2,
        turn_discount: float = 0.9,
        feedback: str = DEFAULT_FEEDBACK,
        success_threshold: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0 < turn_discount <= 1:
            raise ValueError(f"turn_discount must be in (0, 1], got {turn_discount}")
        super().__init__(*args, **kwargs)
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.feedback = feedback
        self.success_threshold = success_threshold

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        """``group_size`` concurrent multi-turn samples of one prompt, merged into one group."""
        messages = list(data["messages"])
        prompt_ids = self.encode_prompt(messages)
        results = await asyncio.gather(
            *(self.asample(client, data, messages, prompt_ids) for _ in range(self.group_size)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, RewardInfrastructureError):
                raise result
        lost = [r for r in results if isinstance(r, RewardInfrastructureError)]
        if lost:
            self.drop_for_reward_infra(str(data["prompt_id"]), lost[0])
            return None
        samples = [r for r in results if not isinstance(r, BaseException)]
        self.reward_counts.dropped_samples += sum(s is None for s in samples)
        return merge_samples(str(data["prompt_id"]), samples)

    async def asample(
        self,
        client: InferenceClient,
        data: dict[str, Any],
        messages: list[dict[str, str]],
        prompt_ids: list[int],
    ) -> list[TrajectoryRow] | None:
        rid = uuid.uuid4().hex  # one rid for every turn: same server, reusable prefix cache
        history = list(messages)
        seq = list(prompt_ids)  # [T] exact tokens so far
        mask = [0] * len(seq)
        logps = [0.0] * len(seq)
        versions = [-1] * len(seq)
        score, info, finish, completion = 0.0, {}, "stop", ""
        n_turns = 0
        for turn in range(self.max_turns):
            if turn > 0:
                env_ids = self.env_delta_ids(history, last_output_token=seq[-1])
                history += [
                    {"role": "assistant", "content": completion},
                    {"role": "user", "content": self.feedback},
                ]
                seq += env_ids
                mask += [0] * len(env_ids)
                logps += [0.0] * len(env_ids)
                versions += [-1] * len(env_ids)
            res = await client.agenerate(GenerateRequest(list(seq), self.sampling, rid=rid))
            check_result(res)
            if res.finish_reason == "abort":
                return None
            n_turns = turn + 1
            seq += res.output_ids
            mask += [1] * len(res.output_ids)
            logps += list(res.output_logprobs)
            versions += list(res.output_versions)
            finish = res.finish_reason
            completion = self.decode(res.output_ids)
            score, info = await self.ascore(messages, completion, data)
            if score >= self.success_threshold or not res.output_ids:
                break
        reward = score * self.turn_discount ** (n_turns - 1)
        row = TrajectoryRow.build(
            traj_id="pending",
            group_id="pending",
            prompt_id=str(data["prompt_id"]),
            input_ids=seq,
            loss_mask=mask,
            logprobs=logps,
            versions=versions,
            reward=reward,
            finish_reason=finish,
            n_turns=n_turns,
            extra=json.dumps({**info, "last_turn_score": score}),
        )
        return [row]

    def env_delta_ids(self, history: list[dict[str, str]], *, last_output_token: int) -> list[int]:
        """Tokens between the assistant's last output and the next generation: close + feedback + prompt.

        If the model stopped on a special token that the template puts there anyway (its end-of-turn
        EOS), that text is not repeated.
        """
        convo = [
            *history,
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": self.feedback},
        ]
        text = render_chat(self.tokenizer, convo, add_generation_prompt=True)
        if _SENTINEL not in text:
            raise ValueError("the chat template drops the assistant's content; multi-turn needs it rendered")
        after = text.split(_SENTINEL, 1)[1]
        stops = set(getattr(self.tokenizer, "all_special_ids", [])) | set(self.sampling.stop_token_ids)
        if last_output_token in stops:
            closing = self.tokenizer.decode([last_output_token], skip_special_tokens=False)
            if closing and after.startswith(closing):
                after = after[len(closing) :]
        return list(self.tokenizer.encode(after, add_special_tokens=False))
