"""The inference contract: what a rollout workflow may ask of the generation backend.

What it is: rollflow-level request/result types and the ``InferenceClient`` Protocol that workflows
depend on (``BatchInferenceClient`` when a client can batch a group's requests; ``agenerate_all`` uses it
when it is there; ``InterruptibleInferenceClient`` when a client can cut its requests and return their
partial output). A result carries, for every output token, the behaviour logprob and the policy version
that produced it; a generation interrupted by a weight update is resumed transparently by the client, so one
result may span several versions.
What it is not: the HTTP wire format (``rollflow.inference.sglang_protocol``) or a client implementation
(``rollflow.inference.client``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """SGLang-compatible sampling parameters (see docs/inference.md for the wire names)."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    sampling_seed: int | None = None


@dataclass
class GenerateRequest:
    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str | None = None  # same rid across turns of an episode => same server (affinity)


@dataclass
class GenerateResult:
    rid: str
    input_ids: list[int]  # the prompt as sent
    output_ids: list[int]
    output_logprobs: list[float]  # behaviour logprob of each output token, len == len(output_ids)
    output_versions: list[int]  # policy version that produced each output token
    finish_reason: FinishReason  # "abort" only if the client gave up (shutdown); interruptions are resumed
    n_interruptions: int = 0  # weight updates / failovers survived
    latency_s: float = 0.0
    server: str = ""  # address of the server that finished the request


@runtime_checkable
class InferenceClient(Protocol):
    """What workflows call. Implementations: ``rollflow.inference.client.EngineClient``."""

    async def agenerate(self, request: GenerateRequest) -> GenerateResult: ...

    def get_version(self) -> int:
        """The newest policy version served (as announced by the checkpoint watcher)."""
        ...


@runtime_checkable
class BatchInferenceClient(InferenceClient, Protocol):
    """A client that can send several requests' first segments as one batch (a GRPO group)."""

    async def agenerate_many(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]: ...


@runtime_checkable
class InterruptibleInferenceClient(InferenceClient, Protocol):
    """A client that can cut its requests in flight and hand back their partial output (a graceful stop
    that keeps its episodes: ``rollflow.rollout.partials``)."""

    def stop_resuming(self) -> None: ...  # an interrupted request returns its partial output from now on

    async def aabort(self, rids: Sequence[str]) -> None: ...  # cut these requests on every server


async def agenerate_all(client: InferenceClient, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    """Every request's result, in order: batched when the client can batch, else one call each."""
    if isinstance(client, BatchInferenceClient):
        return await client.agenerate_many(requests)
    return list(await asyncio.gather(*(client.agenerate(r) for r in requests)))
