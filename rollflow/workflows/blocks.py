"""The building blocks of a rollout workflow: encode a prompt, call the engine, build the trajectory row,
merge turns, merge samples. (Scoring is ``rollflow.workflows.scoring``.)

What it is: small functions, and one accumulator, that the shipped workflows are compositions of::

    prompt_ids = encode_prompt(tokenizer, messages)             # the chat template, exact ids
    results = await generate_samples(client, prompt_ids, sampling, n)   # one batch when the client can
    tokens = TokenTrace.of_prompt(prompt_ids).add_output(res)   # per-token mask, logprobs, versions
    row = tokens.to_row(prompt_id, reward=score, finish_reason=res.finish_reason)
    group = merge_samples(prompt_id, [[row], ...])              # one GRPO group, fresh ids

A multi-turn sample adds the template's text between turns with ``tokens.add_context(
turn_delta_ids(...))`` and the next output with ``add_output``: tokens are never re-tokenized, so the
row is the exact context the engine generated from. Per token ``[T]``:

    loss_mask = 1 on the model's tokens, 0 on prompt, template and environment tokens
    logprobs  = the behaviour logprob on model tokens, 0.0 elsewhere
    versions  = the policy version that produced each model token, -1 elsewhere

What it is not: a workflow (``rlvr``, ``multi_turn``, ``agent`` beside it; docs/workflows.md), and no
reward logic.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.inference import (
    GenerateRequest,
    GenerateResult,
    InferenceClient,
    SamplingParams,
    agenerate_all,
)
from rollflow.api.tokenizer import ChatTokenizer
from storage.schema import TrajectoryGroup, TrajectoryRow

_SENTINEL = "\u2063ROLLFLOW-ASSISTANT-TURN\u2063"


# --- tokenizer and sampling ------------------------------------------------------------------------------


def load_tokenizer(tokenizer: ChatTokenizer | str) -> ChatTokenizer:
    """A tokenizer object as is, or ``AutoTokenizer.from_pretrained(path)``."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)  # type: ignore[no-any-return]
    return tokenizer


def sampling_from(value: SamplingParams | dict[str, Any] | None) -> SamplingParams:
    """``SamplingParams`` from itself, a dict of its fields (a config's ``workflow_kwargs``) or None."""
    if value is None:
        return SamplingParams()
    if isinstance(value, SamplingParams):
        return value
    return SamplingParams(**value)


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


def encode_prompt(tokenizer: ChatTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The ids the engine is asked to continue: the rendered chat with the generation prompt."""
    text = render_chat(tokenizer, messages, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode(tokenizer: ChatTokenizer, ids: Sequence[int]) -> str:
    """The completion text a reward function sees (special tokens skipped)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def turn_delta_ids(
    tokenizer: ChatTokenizer,
    history: list[dict[str, str]],
    new_messages: list[dict[str, str]],
    *,
    last_output_token: int,
    stop_token_ids: Sequence[int] = (),
) -> list[int]:
    """Tokens between the assistant's last output and the next generation: the template's closing of the
    assistant turn, ``new_messages`` (feedback, a tool result), the next generation prompt.

    Found by rendering ``history``, an assistant turn holding a sentinel, and ``new_messages``, and taking
    what follows the sentinel. If the model stopped on a special (or stop) token that the template puts
    there anyway (its end-of-turn EOS), that text is not repeated.
    """
    convo = [*history, {"role": "assistant", "content": _SENTINEL}, *new_messages]
    text = render_chat(tokenizer, convo, add_generation_prompt=True)
    if _SENTINEL not in text:
        raise ValueError("the chat template drops the assistant's content; multi-turn needs it rendered")
    after = text.split(_SENTINEL, 1)[1]
    stops = set(getattr(tokenizer, "all_special_ids", [])) | set(stop_token_ids)
    if last_output_token in stops:
        closing = tokenizer.decode([last_output_token], skip_special_tokens=False)
        if closing and after.startswith(closing):
            after = after[len(closing) :]
    return list(tokenizer.encode(after, add_special_tokens=False))


# --- the engine ------------------------------------------------------------------------------------------


def check_result(res: GenerateResult) -> None:
    """Raise ``ValueError`` unless the result has one logprob and one version per output id."""
    n = len(res.output_ids)
    if len(res.output_logprobs) != n or len(res.output_versions) != n:
        raise ValueError(
            f"inference result {res.rid}: {n} output ids but {len(res.output_logprobs)} logprobs and "
            f"{len(res.output_versions)} versions"
        )


async def generate_samples(
    client: InferenceClient, prompt_ids: list[int], sampling: SamplingParams, n: int
) -> list[GenerateResult]:
    """``n`` independent samples of one prompt (a rid each): one batched first segment when the client
    can batch, checked. Aborted results (``finish_reason == "abort"``: the client gave up) are kept."""
    requests = [GenerateRequest(list(prompt_ids), sampling, rid=uuid.uuid4().hex) for _ in range(n)]
    results = await agenerate_all(client, requests)
    for res in results:
        check_result(res)
    return results


async def generate_turn(
    client: InferenceClient, context_ids: list[int], sampling: SamplingParams, rid: str
) -> GenerateResult:
    """One turn of a conversation, checked. Every turn of a sample uses one ``rid``, so the client keeps
    it on one server (prefix KV reuse)."""
    res = await client.agenerate(GenerateRequest(list(context_ids), sampling, rid=rid))
    check_result(res)
    return res


# --- rows and groups -------------------------------------------------------------------------------------


@dataclass
class TokenTrace:
    """The exact tokens of one sample so far, with their per-token training fields (all ``[T]``)."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    @classmethod
    def of_prompt(cls, prompt_ids: Sequence[int]) -> TokenTrace:
        return cls().add_context(prompt_ids)

    def add_context(self, ids: Sequence[int]) -> TokenTrace:
        """Tokens the model did not produce (prompt, template, environment): never trained on."""
        self.input_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        return self

    def add_output(self, res: GenerateResult) -> TokenTrace:
        """The model's tokens, with the behaviour logprob and version of each."""
        self.input_ids += res.output_ids
        self.loss_mask += [1] * len(res.output_ids)
        self.logprobs += res.output_logprobs
        self.versions += res.output_versions
        return self

    def to_row(
        self,
        prompt_id: str,
        *,
        reward: float,
        finish_reason: str,
        n_turns: int = 1,
        extra: dict[str, Any] | None = None,
    ) -> TrajectoryRow:
        """The trajectory row; its ids are filled in by ``merge_samples``."""
        return TrajectoryRow.build(
            traj_id="pending",
            group_id="pending",
            prompt_id=prompt_id,
            input_ids=list(self.input_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            reward=reward,
            finish_reason=finish_reason,
            n_turns=n_turns,
            extra=json.dumps(extra) if extra else "{}",
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
