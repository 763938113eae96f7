"""Partial episodes: keep the generations in flight across a graceful stop, and continue them on resume.

What it is: ``PartialKeepingClient``, an ``InferenceClient`` around the rollout's client. It records
every result per episode (the executor runs each episode with ``EPISODE_KEY`` set to its prompt
position), and

- at a graceful stop (``astop``: Prefect cancel, SIGTERM, Ctrl-C all set the loop's stop event) it
  tells the inner client to stop re-submitting interrupted requests, aborts its requests in flight
  (each comes back with its partial output: tokens, logprobs, per-token versions), holds them so the
  workflow never sees a cut sample, and waits up to ``drain_s`` for them. ``episodes(keys)`` then
  gives the loop a record per open episode: every sample it had, finished or cut;
- on resume, given those records (``saved``), a request of episode ``p`` whose input ids equal a saved
  sample's takes that sample: a finished one is returned as is (no generation), a cut one is continued,
  the engine asked to go on from input + tokens so far with the remaining budget, and the result is
  the saved tokens followed by the new ones. Per-token versions stay exact (the saved ones keep their
  versions), so the executor's staleness check still judges the group by its oldest token. Matching by
  input ids also replays a multi-turn episode's finished turns, as long as the environment answers
  the same (a turn that differs is generated afresh).

``judge_saved`` drops saved episodes whose oldest token is already beyond the acceptance bound
(``StalenessManager.acceptance_bound``; they would be rejected as stale when done): their prompts are
generated afresh, as today, and counted.

What it is not: storage (``storage.partial_records``) or the stop's signal handling (the flow sets the
stop event). A SIGKILL commits nothing: what was in flight is regenerated, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.api.inference import (
    GenerateRequest,
    GenerateResult,
    InferenceClient,
    InterruptibleInferenceClient,
    agenerate_all,
)
from rollflow.api.staleness import is_stale

logger = logging.getLogger(__name__)

EPISODE_KEY: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "rollflow_episode_key", default=None
)


@dataclass
class PartialSample:
    """One request of an episode as far as it got: input ``[P]``, output ``[O]`` with ``O`` logprobs and
    versions; ``finish_reason`` abort = cut by the stop, stop/length = finished."""

    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    max_new_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason != "abort"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartialSample:
        s = cls(
            input_ids=[int(x) for x in d["input_ids"]],
            output_ids=[int(x) for x in d["output_ids"]],
            output_logprobs=[float(x) for x in d["output_logprobs"]],
            output_versions=[int(x) for x in d["output_versions"]],
            finish_reason=str(d["finish_reason"]),
            max_new_tokens=int(d["max_new_tokens"]),
        )
        if not len(s.output_ids) == len(s.output_logprobs) == len(s.output_versions):
            raise ValueError("a partial sample's output ids, logprobs and versions differ in length")
        return s


def oldest_version(samples: Sequence[PartialSample]) -> int | None:
    """The oldest policy version of any generated token (None: no token yet)."""
    versions = [v for s in samples for v in s.output_versions if v >= 0]
    return min(versions) if versions else None


@dataclass
class _Episode:
    samples: list[PartialSample] = field(default_factory=list)
    saved: list[PartialSample] = field(default_factory=list)  # from the record, not taken yet


class PartialKeepingClient:
    """Implements ``InferenceClient`` (and batching when the inner client batches); see the module docstring."""

    def __init__(
        self, inner: InferenceClient, saved: Mapping[Hashable, Sequence[PartialSample]] | None = None
    ) -> None:
        self.inner = inner
        self._episodes: dict[Hashable, _Episode] = {
            k: _Episode(saved=list(v)) for k, v in (saved or {}).items()
        }
        self._inflight: dict[str, Hashable] = {}  # rid -> episode key
        self._prefix = f"pk{uuid.uuid4().hex[:8]}-"  # every rid sent (names this client's requests in logs)
        self._stopping = False
        self._drained: asyncio.Event | None = None
        self.counters = {"tokens_reused": 0, "samples_reused": 0, "samples_continued": 0}

    def __getattr__(self, name: str) -> Any:  # set_version, pool, apause, ...: the inner client's
        return getattr(self.inner, name)

    def get_version(self) -> int:
        return self.inner.get_version()

    # --- generation -------------------------------------------------------------------------------------

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        return (await self.agenerate_many([request]))[0]

    async def agenerate_many(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        key = EPISODE_KEY.get()
        if self._stopping:
            await self._hold()
        ep = self._episodes.setdefault(key, _Episode()) if key is not None else None
        out: list[GenerateResult | None] = [None] * len(requests)
        fresh: list[tuple[int, GenerateRequest]] = []
        continued: list[tuple[int, GenerateRequest, PartialSample]] = []
        for i, req in enumerate(requests):
            req = dataclasses.replace(req, rid=self._prefix + (req.rid or uuid.uuid4().hex))
            saved = self._take(ep, req) if ep is not None else None
            if saved is not None and saved.finished:
                out[i] = self._result(req, saved)
                self.counters["samples_reused"] += 1
                self.counters["tokens_reused"] += len(saved.output_ids)
            elif saved is not None:
                left = req.sampling.max_new_tokens - len(saved.output_ids)
                sampling = dataclasses.replace(req.sampling, max_new_tokens=max(left, 1))
                cont = GenerateRequest([*req.input_ids, *saved.output_ids], sampling, rid=req.rid)
                continued.append((i, cont, saved))
                self.counters["samples_continued"] += 1
                self.counters["tokens_reused"] += len(saved.output_ids)
            else:
                fresh.append((i, req))
        sent = [r for _, r in fresh] + [c for _, c, _ in continued]
        for r in sent:
            assert r.rid is not None
            self._inflight[r.rid] = key
        try:
            results = await agenerate_all(self.inner, sent) if sent else []
        finally:
            for r in sent:
                self._inflight.pop(r.rid or "", None)
            if self._drained is not None and not self._inflight:
                self._drained.set()
        for (i, _), res in zip(fresh, results[: len(fresh)], strict=True):
            out[i] = res
        for (i, _, saved), res in zip(continued, results[len(fresh) :], strict=True):
            orig = requests[i]
            out[i] = dataclasses.replace(
                res,
                input_ids=list(orig.input_ids),
                output_ids=[*saved.output_ids, *res.output_ids],
                output_logprobs=[*saved.output_logprobs, *res.output_logprobs],
                output_versions=[*saved.output_versions, *res.output_versions],
            )
        done = [r for r in out if r is not None]
        if ep is not None:
            for req, res in zip(requests, done, strict=True):
                ep.samples.append(
                    PartialSample(
                        input_ids=list(req.input_ids),
                        output_ids=list(res.output_ids),
                        output_logprobs=list(res.output_logprobs),
                        output_versions=list(res.output_versions),
                        finish_reason=res.finish_reason,
                        max_new_tokens=req.sampling.max_new_tokens,
                    )
                )
        if self._stopping and any(r.finish_reason == "abort" for r in done):
            await self._hold()  # a cut sample never reaches the workflow: the episode waits to be cancelled
        return done

    def _take(self, ep: _Episode, req: GenerateRequest) -> PartialSample | None:
        for j, s in enumerate(ep.saved):
            if s.input_ids == list(req.input_ids) and s.max_new_tokens == req.sampling.max_new_tokens:
                return ep.saved.pop(j)
        return None

    @staticmethod
    def _result(req: GenerateRequest, s: PartialSample) -> GenerateResult:
        return GenerateResult(
            rid=req.rid or "",
            input_ids=list(req.input_ids),
            output_ids=list(s.output_ids),
            output_logprobs=list(s.output_logprobs),
            output_versions=list(s.output_versions),
            finish_reason=s.finish_reason,  # type: ignore[arg-type]
        )

    async def _hold(self) -> None:
        await asyncio.get_running_loop().create_future()  # until the executor cancels the episode

    # --- the graceful stop ------------------------------------------------------------------------------

    async def astop(self, drain_s: float) -> float:
        """Cut every request in flight and wait up to ``drain_s`` for their partial outputs; seconds taken.

        Requests that did not come back in time are lost (regenerated on resume), as without this client.
        """
        t0 = time.monotonic()
        self._stopping = True
        inner = self.inner
        if not isinstance(inner, InterruptibleInferenceClient):
            return 0.0  # a client that cannot hand back partial output: nothing to keep
        inner.stop_resuming()
        self._drained = asyncio.Event()
        if self._inflight:
            # each rid exactly: SGLang ignores an abort whose rid no request has exactly (a prefix cuts nothing)
            await inner.aabort(list(self._inflight))
            try:
                await asyncio.wait_for(self._drained.wait(), timeout=drain_s)
            except TimeoutError:
                logger.warning(
                    "%d request(s) did not hand back their output within %.1f s; regenerated on resume",
                    len(self._inflight),
                    drain_s,
                )
        return time.monotonic() - t0

    def episodes(self, keys: Sequence[Hashable]) -> dict[Hashable, list[PartialSample]]:
        """The samples of each of ``keys`` that got anywhere (finished or cut with tokens), plus saved ones
        not taken yet (an episode stopped again before it asked for them)."""
        out: dict[Hashable, list[PartialSample]] = {}
        for k in keys:
            ep = self._episodes.get(k)
            if ep is None:
                continue
            kept = [s for s in ep.samples if s.output_ids or s.finished] + ep.saved
            if kept:
                out[k] = kept
        return out

    def forget(self, key: Hashable) -> None:
        """Drop what was recorded of episode ``key`` (it finished: committed or rejected)."""
        self._episodes.pop(key, None)


def judge_saved(
    saved: Mapping[int, Sequence[PartialSample]], *, bound: int
) -> tuple[dict[int, list[PartialSample]], int, int]:
    """``(kept, episodes discarded, tokens discarded)``: an episode whose oldest token is stale against
    ``bound`` (``StalenessManager.acceptance_bound``) would be rejected when done, so its tokens are
    discarded and its prompt generated afresh."""
    kept: dict[int, list[PartialSample]] = {}
    dropped = tokens = 0
    for p, samples in saved.items():
        oldest = oldest_version(samples)
        if oldest is not None and is_stale(oldest, bound):
            dropped += 1
            tokens += sum(len(s.output_ids) for s in samples)
            continue
        kept[p] = list(samples)
    return kept, dropped, tokens


def to_records(
    episodes: Mapping[Hashable, Sequence[PartialSample]], *, block_size: int
) -> list[dict[str, Any]]:
    """Episodes keyed by prompt position -> the JSON-able records of ``storage.partial_records``."""
    return [
        {"position": int(p), "block": int(p) // block_size, "samples": [s.as_dict() for s in samples]}
        for p, samples in episodes.items()
        if isinstance(p, int)
    ]


def from_records(records: Mapping[int, Mapping[str, Any]]) -> dict[int, list[PartialSample]]:
    return {p: [PartialSample.from_dict(s) for s in ep["samples"]] for p, ep in records.items()}
