"""``EngineClient``: the interruptible, failing-over ``InferenceClient`` over any ``Engine``.

What it is: ``agenerate`` sends one generate call (``Engine.generate_call``: SGLang's ``/generate``,
vLLM's ``/inference/v1/generate``) to one server and keeps going until the request stops or reaches
``max_new_tokens``:

- **interruption**: a reply with ``finish_reason.type == "abort"`` (a weight update paused the server, or
  someone aborted the rid) carries the partial output. The client appends it and re-submits
  prompt + all output so far to the **same** server with the remaining budget
  ``max_new_tokens - len(output)``; the server's pause gate holds the new call until it resumes, so
  nothing spins. Each token's policy version is read from the reply's ``weight_versions`` spans
  (``weight_version`` when absent), parsed to int; a version that is not an integer (SGLang's
  ``"default"``, a vLLM server not yet labelled) counts as the client's current ``get_version()``.
- **routing**: rid affinity through a bounded LRU, else the least-loaded server (``routing.ServerPool``).
  Each segment is sent as ``f"{rid}-{n}"``; a cancelled request aborts the tag in flight.
- **failures**: a connection failure (refused, reset, the server died mid-request) marks the server down
  and the segment goes to another server, resumed from prompt + the output received so far (a non-streamed
  reply that never arrived is lost and regenerated). 5xx, 408, 429 and timeouts are retried the same way;
  every server is tried once per round, with ``max_retries`` more rounds after ``retry_backoff_s * 2**k``;
  while a server is being restarted by its supervisor (``pool.set_restarting``) failed rounds do not count,
  so a request waits for the restart instead of failing.
  A 4xx raises ``InvalidRequestError`` at once; no server left raises ``ServerUnavailableError``.

- **batches**: where the engine ``batches`` (SGLang, the CPU server), ``agenerate_many`` sends the first
  segment of several requests with one sampling setting (a GRPO group) as one batched ``/generate``
  (``input_ids`` a list, ``rid`` a list): one HTTP round trip and one server-side parse instead of ``n``.
  A member that comes back interrupted continues on its own as above, from its partial output, on the
  same server; a batch that fails over is resent whole.

``pause()`` / ``resume()`` (blocking, any thread) and ``apause()`` / ``aresume()`` pause all servers of
this client for the synchronous baseline. ``set_version`` / ``get_version`` carry the newest served
policy version (the checkpoint watcher calls ``set_version``; versions seen in replies also raise it).

**Requested shutdown**: after ``shutdown()``, ``stop_resuming()`` or ``aclose()`` a failed call is the
shutdown, not a fault: nothing is logged at WARNING, nothing is retried or failed over, and the request
returns with ``finish_reason == "abort"`` and the output it had.

What it is not: no tokenizer, no streaming, no engine's wire format (``rollflow.inference.sglang``,
``rollflow.inference.vllm``), no HTTP session (``rollflow.inference.transport``), no weight updates
(``rollflow.inference.watcher``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollflow.api.config import InferenceConfig
from rollflow.api.errors import (
    InferenceError,
    InvalidRequestError,
    ServerLostError,
    ServerUnavailableError,
)
from rollflow.api.inference import GenerateRequest, GenerateResult, SamplingParams
from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.inference.contract import Engine
from rollflow.inference.routing import ServerPool
from rollflow.inference.sglang_protocol import GenerateOutput, PauseMode
from rollflow.inference.transport import GenerateTransport, TransientError

logger = logging.getLogger(__name__)


class _ShuttingDown(Exception):
    """A call failed after ``shutdown()``: the request ends as an abort, quietly."""


@dataclass
class _Progress:
    """One request's output so far; ``finish`` is set once it stopped or reached its length."""

    rid: str
    t0: float = field(default_factory=time.monotonic)
    out_ids: list[int] = field(default_factory=list)
    out_lps: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)
    interruptions: int = 0
    idle_aborts: int = 0
    segment: int = 0
    server: str | None = None
    finish: str | None = None


class EngineClient:
    """Implements ``rollflow.api.inference.InferenceClient``. Safe to build outside an event loop."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        engine: Engine | None = None,
        api_key: str | None = None,
        request_timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        affinity_lru_size: int = 4096,
        metrics: MetricsSink | None = None,
        initial_version: int = 0,
        max_idle_aborts: int = 100,
        down_cooldown_s: float = 5.0,
    ) -> None:
        self.pool = ServerPool(
            addresses, affinity_lru_size=affinity_lru_size, down_cooldown_s=down_cooldown_s
        )
        if engine is None:
            from rollflow.inference.sglang import SGLangEngine

            engine = SGLangEngine()
        self.engine: Engine = engine
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.max_idle_aborts = max_idle_aborts
        self.metrics: MetricsSink = metrics or NullSink()
        self._version = initial_version
        self._version_lock = threading.Lock()
        self.transport = GenerateTransport(engine, api_key, request_timeout_s, connect_timeout_s)
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, str] = {}  # rid -> the tag of its segment in flight (for aborts)
        self.counters = {"requests": 0, "segments": 0, "interruptions": 0, "failovers": 0, "retries": 0}

    @classmethod
    def from_config(
        cls, cfg: InferenceConfig, addresses: Sequence[str], *, metrics: MetricsSink | None = None
    ) -> EngineClient:
        """The client for ``inference.backend``'s engine (``rollflow.inference.engines.engine_for``)."""
        from rollflow.inference.engines import engine_for

        return cls(
            addresses,
            engine=engine_for(cfg),
            api_key=cfg.api_key,
            request_timeout_s=cfg.request_timeout_s,
            connect_timeout_s=cfg.connect_timeout_s,
            max_retries=cfg.max_retries,
            retry_backoff_s=cfg.retry_backoff_s,
            affinity_lru_size=cfg.affinity_lru_size,
            metrics=metrics,
            initial_version=int(v) if (v := cfg.initial_weight_version).isdigit() else 0,
        )

    @property
    def addresses(self) -> list[str]:
        return list(self.pool.addresses)

    # --- versions ------------------------------------------------------------------------------------------------

    def set_version(self, version: int) -> None:
        """Called by the checkpoint watcher once its servers serve ``version`` (never lowers it)."""
        with self._version_lock:
            self._version = max(self._version, int(version))

    def get_version(self) -> int:
        with self._version_lock:
            return self._version

    def _parse_version(self, v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            return self.get_version()
        self.set_version(n)
        return n

    # --- generation ------------------------------------------------------------------------------------------------

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        """Generate until stop / length across pauses, aborts and server deaths (see module docstring)."""
        if not request.input_ids:
            raise InvalidRequestError("GenerateRequest.input_ids must not be empty")
        self.counters["requests"] += 1
        return await self._continue(request, _Progress(rid=request.rid or uuid.uuid4().hex))

    async def agenerate_many(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """``agenerate`` for each request, the first segments sent as one batched ``/generate``.

        Results come back in the order of ``requests``. Requests whose sampling settings differ, different
        prompts on an engine that batches only one prompt sampled ``n`` times (vLLM), or an engine that does
        not batch, send each request on its own; a single request is plain ``agenerate``.
        """
        if (
            len(requests) <= 1
            or not self.engine.batches
            or any(r.sampling != requests[0].sampling for r in requests)
            or (
                self.engine.batches_one_prompt_only
                and any(list(r.input_ids) != list(requests[0].input_ids) for r in requests)
            )
        ):
            return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))
        for r in requests:
            if not r.input_ids:
                raise InvalidRequestError("GenerateRequest.input_ids must not be empty")
        self.counters["requests"] += len(requests)
        progress = [_Progress(rid=r.rid or uuid.uuid4().hex) for r in requests]
        sp = requests[0].sampling
        inputs = [list(r.input_ids) for r in requests]  # [n][P_i]
        rids = [p.rid for p in progress]
        try:
            server, outs, segment, failovers = await self._send(
                rids, inputs, sp, sp.max_new_tokens, 0, prefer=None
            )
        except _ShuttingDown:
            return [self._result(r, p, "abort") for r, p in zip(requests, progress, strict=True)]
        except asyncio.CancelledError:
            for addr in self.pool.addresses:  # the batch's server is not known until it answers
                self._abort_all_quietly(addr, rids)
            raise
        for p, out in zip(progress, outs, strict=True):
            p.server, p.segment, p.interruptions = server, segment, failovers
            self._append(out, p.out_ids, p.out_lps, p.out_versions)
            if out.finish_type != "abort":
                p.finish = out.finish_type if out.finish_type in ("stop", "length") else "stop"
            else:
                p.interruptions += 1
                self.counters["interruptions"] += 1
                p.idle_aborts = 0 if out.output_ids else 1
        return list(
            await asyncio.gather(*(self._continue(r, p) for r, p in zip(requests, progress, strict=True)))
        )

    async def _continue(self, request: GenerateRequest, p: _Progress) -> GenerateResult:
        """Generate from ``p`` (the output so far) until stop / length; ``p.finish`` set means done."""
        t0 = p.t0
        sp = request.sampling
        rid = p.rid
        prompt = list(request.input_ids)
        out_ids, out_lps, out_versions = p.out_ids, p.out_lps, p.out_versions
        interruptions, idle_aborts, segment = p.interruptions, p.idle_aborts, p.segment
        server: str | None = p.server
        finish = p.finish or "length"
        try:
            while p.finish is None:  # set when a batched first segment already finished it
                remaining = sp.max_new_tokens - len(out_ids)
                if remaining <= 0:
                    finish = "length"
                    break
                if self._closed:
                    finish = "abort"
                    break
                try:
                    server, outs, segment, failovers = await self._send(
                        [rid], [prompt + out_ids], sp, remaining, segment, prefer=server
                    )
                except _ShuttingDown:
                    finish = "abort"
                    break
                out = outs[0]
                interruptions += failovers
                self._append(out, out_ids, out_lps, out_versions)
                if out.finish_type != "abort":
                    finish = out.finish_type if out.finish_type in ("stop", "length") else "stop"
                    break
                interruptions += 1
                self.counters["interruptions"] += 1
                idle_aborts = 0 if out.output_ids else idle_aborts + 1
                if idle_aborts > self.max_idle_aborts:
                    raise InferenceError(
                        f"rid {rid}: aborted {idle_aborts} times in a row without progress on {server} "
                        f"(last: {out.finish_reason.get('message')!r})"
                    )
                if idle_aborts > 1:  # not a pause (the pause gate would hold us): back off
                    await asyncio.sleep(min(self.retry_backoff_s * 2 ** (idle_aborts - 2), 5.0))
        except asyncio.CancelledError:
            self._abort_all_quietly(server, [rid])  # free the server's slot for this rid
            raise
        return GenerateResult(
            rid=rid,
            input_ids=prompt,
            output_ids=out_ids,
            output_logprobs=out_lps,
            output_versions=out_versions,
            finish_reason=finish,  # type: ignore[arg-type]
            n_interruptions=interruptions,
            latency_s=time.monotonic() - t0,
            server=server or "",
        )

    @staticmethod
    def _result(request: GenerateRequest, p: _Progress, finish: str) -> GenerateResult:
        """``p``'s output so far as a result (a request ended by a shutdown before it ran)."""
        return GenerateResult(
            rid=p.rid,
            input_ids=list(request.input_ids),
            output_ids=p.out_ids,
            output_logprobs=p.out_lps,
            output_versions=p.out_versions,
            finish_reason=finish,  # type: ignore[arg-type]
            n_interruptions=p.interruptions,
            latency_s=time.monotonic() - p.t0,
            server=p.server or "",
        )

    def _append(self, out: GenerateOutput, ids: list[int], lps: list[float], versions: list[int]) -> None:
        if out.output_token_logprobs is None:
            raise InferenceError(f"server reply for {out.rid} has no output_token_logprobs")
        ids.extend(out.output_ids)
        lps.extend(out.output_token_logprobs)
        cache: dict[str, int] = {}
        for v in out.token_versions:
            if v not in cache:
                cache[v] = self._parse_version(v)
            versions.append(cache[v])

    async def _send(
        self,
        rids: list[str],
        inputs: list[list[int]],
        sp: SamplingParams,
        max_new_tokens: int,
        segment: int,
        *,
        prefer: str | None,
    ) -> tuple[str, list[GenerateOutput], int, int]:
        """One segment (of one request, or a batch: one rid each) with retries and failover.

        Returns ``(server, replies in rid order, next_segment, n_failovers)``; raises ``_ShuttingDown``
        when a call fails after ``shutdown()``.
        """
        rid = rids[0]  # routing key of the batch
        errors: list[str] = []
        round_ = 0
        while round_ <= self.max_retries:
            tried: set[str] = set()
            while True:
                addr = (
                    prefer
                    if prefer is not None and prefer not in tried and not self.pool.is_down(prefer)
                    else None
                )
                addr = addr or self.pool.pick(rid, exclude=tried)
                if addr is None:
                    break
                tried.add(addr)
                tagged = [f"{r}-{segment}" for r in rids]
                call = self.engine.generate_call(tagged, inputs, sp, max_new_tokens)
                segment += 1
                self.counters["segments"] += 1
                self.pool.acquire(addr)
                self._in_flight.update(zip(rids, tagged, strict=True))
                try:
                    outs = await self.transport.post_generate(addr, call.route, call.payload, tagged)
                except TransientError as e:
                    if self._closed:  # a requested shutdown: the server going away is expected
                        raise _ShuttingDown(str(e)) from None
                    errors.append(str(e))
                    logger.warning("rid %s on %s: %s; trying another server", rid, addr, e)
                    if e.down:
                        self.pool.mark_down(addr)
                    self.counters["failovers"] += 1
                    self.metrics.log({"inference/failovers": float(self.counters["failovers"])})
                    prefer = None
                    continue
                finally:
                    self.pool.release(addr)
                    for r in rids:
                        self._in_flight.pop(r, None)
                self.pool.mark_up(addr)
                self.pool.remember(rid, addr)
                return addr, outs, segment, len(errors)
            if self._closed:
                raise _ShuttingDown("the client was shut down")
            if self.pool.restarting():  # its supervisor is bringing a server back: wait, not a round
                await asyncio.sleep(min(1.0, self.retry_backoff_s))
                continue
            if round_ < self.max_retries:
                self.counters["retries"] += 1
                await asyncio.sleep(self.retry_backoff_s * 2**round_)
            round_ += 1
        if not self.pool.live_addresses:
            raise ServerLostError(f"rid {rid}: every inference server was dropped: {self.pool.dropped()}")
        raise ServerUnavailableError(
            f"rid {rid}: no server completed the request after {self.max_retries + 1} rounds over "
            f"{len(self.pool.addresses)} server(s); last errors: {errors[-3:]}"
        )

    def _abort_all_quietly(self, addr: str | None, rids: list[str]) -> None:
        """Best effort, in the background: free the server's slots of ``rids`` (a cancelled batch)."""
        if addr is None:
            return
        for rid in rids:
            tag = self._in_flight.get(rid, rid)  # the segment in flight (vLLM aborts exact ids only)
            task = asyncio.get_running_loop().create_task(self.transport.abort_quietly(addr, tag))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # --- pause / resume (synchronous baseline) -----------------------------------------------------------------

    async def apause(self, mode: PauseMode = "abort") -> None:
        """Pause every server; in-flight calls return aborted and are resumed later."""
        await asyncio.to_thread(self.pause, mode)

    async def aresume(self) -> None:
        await asyncio.to_thread(self.resume)

    def pause(self, mode: PauseMode = "abort") -> None:
        """Blocking ``apause`` for code outside the event loop (e.g. the trainer's step hook)."""
        for a in self.pool.addresses:
            self.engine.pause(a, mode, api_key=self.api_key, timeout_s=self.request_timeout_s)

    def resume(self) -> None:
        for a in self.pool.addresses:
            self.engine.resume(a, api_key=self.api_key, timeout_s=self.request_timeout_s)

    def stop_resuming(self) -> None:
        """From now on an interrupted request returns its partial output (``finish_reason`` abort) instead
        of being re-submitted: a graceful stop that keeps its partial episodes (``rollout.partials``)."""
        self._closed = True

    async def aabort(self, rids: Sequence[str]) -> None:
        """Abort ``rids`` (the segment each has in flight) on every server; each returns its partial output."""
        tags = [self._in_flight.get(r, r) for r in rids]
        await asyncio.gather(*(self.transport.abort_quietly(a, t) for a in self.pool.addresses for t in tags))

    def shutdown(self) -> None:
        """A requested stop (any thread): from now on failures end requests quietly as aborts."""
        self._closed = True

    async def aclose(self) -> None:
        """Stop resuming interrupted requests and close the HTTP session."""
        self._closed = True
        await self.transport.aclose()
