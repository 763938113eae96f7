"""RLVRWorkflow: single-turn reinforcement learning from verifiable rewards, one group per prompt.

What it is: for one dataset row ``{"prompt_id", "messages", "answer", ...}`` it applies the tokenizer's
chat template (``add_generation_prompt=True``), runs ``group_size`` samples through the ``InferenceClient``
(one batched request when the client can batch), scores the completions (one reward-worker round trip) with the reward function (in a process pool, with a
timeout: a reward that raises or hangs scores 0 and is counted, see ``rollflow.rewards``), and returns
one ``TrajectoryGroup``. A sample whose reward worker died (``infra_error``: no score at all, not a
score of 0) drops its whole group, counted as ``groups_dropped_reward_infra``: reward infrastructure is
not a training signal. Each row is ``prompt + completion`` with, per token (``[T] = [P + O]``):

    loss_mask = [0] * P + [1] * O          # train on the model's tokens only
    logprobs  = [0.0] * P + behaviour_logp  # as sampled by the server
    versions  = [-1] * P + output_versions  # one trajectory may span several policy versions

Grouped rollout: a sample that returns None (the client gave up on it: ``finish_reason == "abort"``)
is dropped from its group; a group whose samples are all None is rejected (the episode returns None).
``GroupedRolloutWorkflow`` applies the same rule to any workflow that produces one sample per call.

What it is not: the scheduler (``rollflow.rollout.executor``) or the reward functions themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollflow.api.errors import RewardInfrastructureError
from rollflow.api.inference import (
    GenerateRequest,
    GenerateResult,
    InferenceClient,
    SamplingParams,
    agenerate_all,
)
from rollflow.api.workflow import RolloutWorkflow, import_string
from storage.schema import TrajectoryGroup, TrajectoryRow

logger = logging.getLogger(__name__)


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the workflows use."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class RewardScorer(Protocol):
    """``rollflow.rewards.AsyncRewardRunner``: returns an outcome with ``score``, ``error``, ``timed_out``."""

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> Any: ...


@dataclass
class RewardCounts:
    """What the workflow saw of the reward function (the runner keeps its own stats too)."""

    scored: int = 0
    errors: int = 0
    timeouts: int = 0
    dropped_samples: int = 0  # samples that returned None (aborted)
    dropped_groups_infra: int = 0  # groups dropped because a reward worker could not score a sample
    score_sum: float = 0.0
    _first_error: list[str] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        return {
            "reward_scored": float(self.scored),
            "reward_errors": float(self.errors),
            "reward_timeouts": float(self.timeouts),
            "samples_dropped": float(self.dropped_samples),
            "groups_dropped_reward_infra": float(self.dropped_groups_infra),
        }


def load_tokenizer(tokenizer: ChatTokenizer | str) -> ChatTokenizer:
    """A tokenizer object as is, or ``AutoTokenizer.from_pretrained(path)``."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


def render_chat(
    tokenizer: ChatTokenizer, messages: list[dict[str, str]], *, add_generation_prompt: bool
) -> str:
    """The chat template as text. Tokenize it with ``encode(text, add_special_tokens=False)``."""
    if getattr(tokenizer, "chat_template", "x") is None:
        raise ValueError("the tokenizer has no chat_template; set one (tokenizer.chat_template = ...)")
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def sampling_from(value: SamplingParams | dict[str, Any] | None) -> SamplingParams:
    if value is None:
        return SamplingParams()
    if isinstance(value, SamplingParams):
        return value
    return SamplingParams(**value)


def check_result(res: GenerateResult) -> None:
    n = len(res.output_ids)
    if len(res.output_logprobs) != n or len(res.output_versions) != n:
        raise ValueError(
            f"inference result {res.rid}: {n} output ids but {len(res.output_logprobs)} logprobs and "
            f"{len(res.output_versions)} versions"
        )


def merge_samples(prompt_id: str, samples: Sequence[list[TrajectoryRow] | None]) -> TrajectoryGroup | None:
    """One group from per-sample rows: None samples are dropped; all None -> None (rejected)."""
    kept = [rows for rows in samples if rows is not None]
    if not kept:
        return None
    group_id = uuid.uuid4().hex
    out: list[TrajectoryRow] = []
    for rows in kept:
        for row in rows:
            row.group_id, row.prompt_id = group_id, prompt_id
            row.traj_id = f"{group_id}-{len(out)}"
            out.append(row)
    return TrajectoryGroup(group_id, prompt_id, out)


class RLVRWorkflow(RolloutWorkflow):
    """Single-turn RLVR: ``group_size`` concurrent samples per prompt, each scored by ``reward_fn``."""

    def __init__(
        self,
        reward_fn: str | Callable[..., float],
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
        self._owns_runner = reward_runner is None
        if reward_runner is None:
            from rollflow.rewards.inprocess import reward_runner_for

            reward_runner = reward_runner_for(
                reward_fn, max_workers=reward_workers, timeout_s=reward_timeout_s
            )
        self.reward_runner = reward_runner
        self.reward_counts = RewardCounts()

    # --- the episode -----------------------------------------------------------------------------------

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        prompt_id = str(data["prompt_id"])
        messages = list(data["messages"])
        prompt_ids = self.encode_prompt(messages)
        requests = [
            GenerateRequest(list(prompt_ids), self.sampling, rid=uuid.uuid4().hex)
            for _ in range(self.group_size)
        ]
        results = await agenerate_all(client, requests)  # one batched first segment when the client can
        for res in results:
            check_result(res)
        done = [res for res in results if res.finish_reason != "abort"]  # the client gave up on the rest
        self.reward_counts.dropped_samples += len(results) - len(done)
        try:
            scored = await self.ascore_many(messages, [self.decode(res.output_ids) for res in done], data)
        except RewardInfrastructureError as exc:
            self.drop_for_reward_infra(prompt_id, exc)
            return None
        samples = [
            [self.build_row(data, prompt_ids, res, score, info)]
            for res, (score, info) in zip(done, scored, strict=True)
        ]
        return merge_samples(prompt_id, samples)

    def build_row(
        self,
        data: dict[str, Any],
        prompt_ids: list[int],
        res: GenerateResult,
        score: float,
        info: dict[str, Any],
    ) -> TrajectoryRow:
        """One scored completion of the prompt as a trajectory row (ids filled in by ``merge_samples``)."""
        n_prompt, n_out = len(prompt_ids), len(res.output_ids)
        return TrajectoryRow.build(
            traj_id="pending",
            group_id="pending",
            prompt_id=str(data["prompt_id"]),
            input_ids=[*prompt_ids, *res.output_ids],  # [P + O]
            loss_mask=[0] * n_prompt + [1] * n_out,
            logprobs=[0.0] * n_prompt + list(res.output_logprobs),
            versions=[-1] * n_prompt + list(res.output_versions),
            reward=score,
            finish_reason=res.finish_reason,
            extra=json.dumps(info) if info else "{}",
        )

    # --- helpers shared with MultiTurnWorkflow ---------------------------------------------------------

    def encode_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = render_chat(self.tokenizer, messages, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    async def ascore(
        self, messages: list[dict[str, str]], completion: str, data: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """(score, extra info for the row). Errors and timeouts score 0 and are counted, never raised.

        Raises:
            RewardInfrastructureError: no worker could score the completion (``outcome.infra_error``).
        """
        return (await self.ascore_many(messages, [completion], data))[0]

    async def ascore_many(
        self, messages: list[dict[str, str]], completions: Sequence[str], data: dict[str, Any]
    ) -> list[tuple[float, dict[str, Any]]]:
        """``ascore`` for several completions of one prompt: one reward-worker round trip when the runner
        can take a batch (``AsyncRewardRunner.ascore_many``), else one call each.

        Raises:
            RewardInfrastructureError: no worker could score one of them (nothing is counted then).
        """
        if not completions:
            return []
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        extra = {k: v for k, v in data.items() if k not in ("messages", "answer", "prompt_id")}
        answer = data.get("answer")
        many = getattr(self.reward_runner, "ascore_many", None)
        if many is not None:
            outcomes = await many(prompt, list(completions), answer, **extra)
        else:
            outcomes = await asyncio.gather(
                *(self.reward_runner.ascore(prompt, c, answer, **extra) for c in completions)
            )
        lost = [o for o in outcomes if getattr(o, "infra_error", False)]
        if lost:
            raise RewardInfrastructureError(f"reward of prompt {data.get('prompt_id')!r}: {lost[0].error}")
        return [self._account(outcome) for outcome in outcomes]

    def drop_for_reward_infra(self, prompt_id: str, exc: RewardInfrastructureError) -> None:
        """Count and log a group dropped because no reward worker could score one of its samples."""
        self.reward_counts.dropped_groups_infra += 1
        logger.error(
            "group of prompt %s dropped: a reward worker could not score a sample (%s)", prompt_id, exc
        )

    def _account(self, outcome: Any) -> tuple[float, dict[str, Any]]:
        counts = self.reward_counts
        counts.scored += 1
        info: dict[str, Any] = {}
        if getattr(outcome, "timed_out", False):
            counts.timeouts += 1
            info["reward_timed_out"] = True
        if getattr(outcome, "error", None):
            counts.errors += 1
            info["reward_error"] = str(outcome.error)[:500]
        score = float(outcome.score) if not info else 0.0
        counts.score_sum += score
        return score, info

    def close(self) -> None:
        """Stop the reward process pool this workflow started."""
        if self._owns_runner:
            close = getattr(self.reward_runner, "close", None)
            if close is not None:
                close()


class GroupedRolloutWorkflow(RolloutWorkflow):
    """Run a one-sample workflow ``group_size`` times concurrently and merge the results into one group."""

    def __init__(self, workflow: RolloutWorkflow, group_size: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.workflow = workflow
        self.group_size = group_size

    async def arun_episode(self, client: InferenceClient, data: dict[str, Any]) -> TrajectoryGroup | None:
        results = await asyncio.gather(
            *(self.workflow.arun_episode(client, data) for _ in range(self.group_size))
        )
        return merge_samples(str(data["prompt_id"]), [g.rows if g is not None else None for g in results])
