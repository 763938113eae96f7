"""The CPU server's engine: continuous batching over a stock transformers model, with pause/abort/update.

What it is: one background thread that owns the model and a ``SlotKVCache``. Every iteration it

1. moves newly submitted requests into the waiting queue and runs queued control commands (abort by rid
   prefix, pause in mode abort/retract/in_place, continue, weight swap, flush) — so control never races a
   forward pass;
2. admits waiting requests into free slots (``max_batch_size``; prefill padded tokens capped by
   ``max_prefill_tokens``), appended after the running rows;
3. runs ONE decode forward over all running rows ``[0, n_dec)`` (one token each) and ONE prefill forward over
   the newly admitted rows ``[n_dec, n)`` (prompt + any output so far, left-padded), samples one token per
   row (``sampling.sample_rows``), and checks stop / length;
4. returns finished rows and compacts the slots (the last row moves into the hole).

So a request that arrives while others decode joins at the next iteration; nobody waits for a batch to
drain. Results are delivered through a callback (the HTTP layer wraps it into an asyncio future).

Weight versions: a swap while requests are kept (pause modes retract / in_place) records
``(old_version, n_output_tokens)`` on each of them, and the reply's ``weight_versions`` spans are computed
from these events exactly as SGLang does. A swap asked to flush the cache while requests are still
running (an ``in_place`` pause) is applied anyway and reports ``flushed=False``, as SGLang's scheduler
does (its HTTP layer then answers 400 although the new weights are live). Without a pause, an update waits until the running requests
finish (SGLang's writer lock) and new requests wait behind it; with ``abort_all_requests`` it aborts them.

What it is not: no HTTP (``app.py``), no weight file checks (``weights.py``), no tokenizer.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from infra.cpu_server.kv_cache import SlotKVCache
from infra.cpu_server.sampling import RowSampling, sample_rows, seeded_uniform
from infra.cpu_server.weights import swap_weights_in_place
from rollflow.inference.sglang_protocol import (
    PauseMode,
    WireSamplingParams,
    compute_weight_version_spans,
    finish_abort,
    finish_length,
    finish_stop,
)

logger = logging.getLogger(__name__)

ResultCallback = Callable[[dict[str, Any]], None]
Detokenize = Callable[[list[int], bool], str]


@dataclass
class EngineConfig:
    context_len: int  # prompt + output never exceed this (max_position_embeddings)
    eos_token_ids: tuple[int, ...] = ()
    max_batch_size: int = 64
    max_prefill_tokens: int = 8192  # padded prompt tokens admitted per iteration (at least one request)
    weight_version: str = "default"
    seed: int | None = None  # seeds the draws of requests without sampling_seed
    batch_window_s: float = 0.003  # an idle engine waits this long for a burst to arrive before prefilling


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    rid: str
    prompt: list[int]
    sp: WireSamplingParams
    on_done: ResultCallback
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    version_events: list[tuple[str, int]] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    n_retractions: int = 0
    finish: dict[str, Any] | None = None
    submitted_at: float = field(default_factory=time.monotonic)

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.output_ids)

    def tokens(self) -> list[int]:
        return self.prompt + self.output_ids


@dataclass(frozen=True)
class SwapResult:
    kept: int  # requests kept across the swap (running or queued)
    flushed: bool  # False: a flush was asked while requests were running, so the cache was kept


@dataclass
class _Pending:
    tensors: dict[str, torch.Tensor]
    weight_version: str | None
    future: Future[SwapResult]
    flush_cache: bool = True


class Engine:
    """Thread-safe facade; all model work happens on the engine thread (``start()``)."""

    def __init__(
        self, model: torch.nn.Module, config: EngineConfig, detokenize: Detokenize | None = None
    ) -> None:
        self.model = model.eval()
        self.cfg = config
        self.detokenize = detokenize
        self.weight_version = config.weight_version
        self.cache = SlotKVCache(config.max_batch_size, config.context_len + 1)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._rng = random.Random(config.seed)
        self._cv = threading.Condition()
        self._incoming: list[Sequence] = []
        self._commands: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        # engine-thread state
        self._running: list[Sequence] = []  # row r of the cache holds _running[r]
        self._waiting: deque[Sequence] = deque()
        self._paused: PauseMode | None = None
        self._pending: _Pending | None = None
        self._stats: dict[str, float] = {
            "decode_steps": 0, "decode_seqs_total": 0, "max_decode_batch": 0, "last_decode_batch": 0,
            "prefill_steps": 0, "prefill_seqs_total": 0, "max_prefill_batch": 0, "generated_tokens": 0,
            "finished_requests": 0, "aborted_requests": 0, "weight_updates": 0, "last_swap_s": 0.0,
            "busy_s": 0.0,  # wall time in forward passes and sampling (the engine thread's work)
        }  # fmt: skip
        self._started_at = time.monotonic()
        self._snapshot: dict[str, Any] = {}
        self._publish_snapshot()

    # --- thread-safe API -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cpu-server-engine", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def submit(self, seq: Sequence) -> None:
        with self._cv:
            if not self._stopping:
                self._incoming.append(seq)
                self._cv.notify()
                return
        self._deliver(seq, finish_abort("Server is shutting down"))

    def abort(self, rid: str = "", abort_all: bool = False) -> Future[int]:
        """Abort as SGLang 0.5.23 does; returns how many. Its tokenizer manager passes an abort on only when
        a request with exactly ``rid`` is in flight (else it is ignored), and its scheduler then aborts every
        request whose rid starts with ``rid``."""

        def cmd() -> int:
            if not abort_all and not any(s.rid == rid for s in [*self._running, *self._waiting]):
                return 0
            return self._abort_where(lambda s: abort_all or (bool(rid) and s.rid.startswith(rid)))

        return self._command(cmd)

    def pause(self, mode: PauseMode) -> Future[None]:
        return self._command(lambda: self._pause(mode))

    def resume(self) -> Future[None]:
        return self._command(self._resume)

    def update_weights(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        weight_version: str | None,
        abort_all_requests: bool,
        flush_cache: bool = True,
    ) -> Future[SwapResult]:
        """Swap in checked tensors; resolves to the requests kept across the swap and whether the cache
        was flushed (not while requests run: SGLang's rule)."""
        fut: Future[SwapResult] = Future()

        def cmd() -> None:
            if abort_all_requests:
                self._abort_where(lambda s: True)
            if self._pending is not None:
                self._pending.future.set_exception(RuntimeError("superseded by a newer weight update"))
            self._pending = _Pending(tensors, weight_version, fut, flush_cache)
            self._maybe_apply_pending()

        def propagate(cf: Future[Any]) -> None:  # the command itself failed (e.g. shutting down)
            if cf.exception() is not None and not fut.done():
                fut.set_exception(cf.exception())  # type: ignore[arg-type]

        self._command(cmd).add_done_callback(propagate)
        return fut

    def set_weight_version(self, version: str) -> Future[None]:
        """SGLang's ``/update_weight_version``: the version new tokens are tagged with, weights unchanged."""

        def cmd() -> None:
            if version != self.weight_version:
                for s in [*self._running, *self._waiting]:
                    if s.output_ids:
                        s.version_events.append((self.weight_version, len(s.output_ids)))
                self.weight_version = version

        return self._command(cmd)

    def flush_cache(self) -> Future[bool]:
        def cmd() -> bool:
            if self._running or self._waiting:
                return False
            self.cache.reset()
            return True

        return self._command(cmd)

    def stats(self) -> dict[str, Any]:
        return dict(self._snapshot)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort everything in flight (each gets its partial output) and stop the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- engine thread -------------------------------------------------------------------------------------------

    def _command(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cv:
            if self._stopping:
                fut.set_exception(RuntimeError("server is shutting down"))
                return fut
            self._commands.append((fn, fut))
            self._cv.notify()
        return fut

    def _can_step(self) -> bool:
        if self._paused is not None:
            return False
        return bool(self._running) or (bool(self._waiting) and self._pending is None)

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not (self._stopping or self._commands or self._incoming or self._can_step()):
                        self._cv.wait(timeout=1.0)
                    commands, self._commands = self._commands, []
                    incoming, self._incoming = self._incoming, []
                    stopping = self._stopping
                if incoming and not self._running and not commands and self.cfg.batch_window_s > 0:
                    incoming += self._gather_burst()
                for seq in incoming:
                    if seq.sp.max_new_tokens == 0:
                        self._deliver(seq, finish_length(0))
                    else:
                        self._waiting.append(seq)
                for fn, fut in commands:
                    try:
                        fut.set_result(fn())
                    except Exception as e:  # a command failing must not kill the engine
                        logger.exception("engine command failed")
                        if not fut.done():
                            fut.set_exception(e)
                if stopping:
                    self._abort_where(lambda s: True, message="Server is shutting down")
                    if self._pending is not None:
                        self._pending.future.set_exception(RuntimeError("server is shutting down"))
                    return
                self._maybe_apply_pending()
                if self._can_step():
                    t_step = time.perf_counter()
                    try:
                        self._step()
                    except Exception as e:
                        logger.exception("forward pass failed; aborting the running requests")
                        self._abort_where(
                            lambda s: s in self._running, message=f"engine error: {e}", status=500
                        )
                        self.cache.reset()
                    self._stats["busy_s"] += time.perf_counter() - t_step
                self._publish_snapshot()

    def _gather_burst(self) -> list[Sequence]:
        """Idle engine, first request in: wait ``batch_window_s`` so a burst (a GRPO group, a client's
        concurrent calls) is prefilled and decoded as one batch instead of trickling in over several steps."""
        deadline = time.monotonic() + self.cfg.batch_window_s
        with self._cv:
            while not self._stopping and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(timeout=left)
            more, self._incoming = self._incoming, []
        return more

    def _step(self) -> None:
        running = self._running
        n_dec = len(running)
        new: list[Sequence] = []
        if self._pending is None:
            longest = 0
            while self._waiting and len(running) < self.cfg.max_batch_size:
                n = self._waiting[0].n_tokens
                if new and (len(new) + 1) * max(longest, n) > self.cfg.max_prefill_tokens:
                    break
                seq = self._waiting.popleft()
                seq.cached = 0
                running.append(seq)
                new.append(seq)
                longest = max(longest, n)
        st = self._stats
        if n_dec:
            rows = running[:n_dec]
            logits = self._forward(0, n_dec, [[s.output_ids[-1]] for s in rows], [s.cached for s in rows])
            for s in rows:
                s.cached += 1
            self._sample(rows, logits)
            st["decode_steps"] += 1
            st["decode_seqs_total"] += n_dec
            st["last_decode_batch"] = n_dec
            st["max_decode_batch"] = max(st["max_decode_batch"], n_dec)
        if new:
            feeds = [s.tokens() for s in new]
            logits = self._forward(n_dec, len(running), feeds, [0] * len(new))
            for s, f in zip(new, feeds, strict=True):
                s.cached = len(f)
            self._sample(new, logits)
            st["prefill_steps"] += 1
            st["prefill_seqs_total"] += len(new)
            st["max_prefill_batch"] = max(st["max_prefill_batch"], len(new))
        done = [s for s in running if s.finish is not None]
        if done:
            self._remove(done)
            for s in done:
                assert s.finish is not None
                self._deliver(s, s.finish)

    def _forward(self, lo: int, hi: int, feeds: list[list[int]], starts: list[int]) -> torch.Tensor:
        """One forward over cache rows [lo, hi); row i feeds ``feeds[i]`` at positions ``starts[i]...``.

        Rows are left-padded to Q tokens so every row's last real token sits at query slot Q-1 (one lm_head
        row per sequence). A pad slot writes to a scratch position past the row's end, which a later real
        token overwrites before anything can attend to it. Returns ``[B, V]`` float32 logits.
        """
        B, Q = hi - lo, max(len(f) for f in feeds)
        start = torch.tensor(starts, dtype=torch.long)  # [B]
        if Q == 1:
            ids = torch.tensor(feeds, dtype=torch.long)  # [B, 1]
            pos = start.unsqueeze(1)  # [B, 1]
            write = pos
        else:
            ids = torch.zeros(B, Q, dtype=torch.long)
            pos = torch.empty(B, Q, dtype=torch.long)
            write = torch.empty(B, Q, dtype=torch.long)
            ar = torch.arange(Q)
            for i, f in enumerate(feeds):
                q, pad, s = len(f), Q - len(f), starts[i]
                ids[i, pad:] = torch.tensor(f)
                pos[i, pad:] = s + ar[:q]
                pos[i, :pad] = s
                write[i, pad:] = s + ar[:q]
                write[i, :pad] = s + q + ar[:pad]
        kv_len = int(start.max()) + Q
        mask = (torch.arange(kv_len).view(1, 1, kv_len) <= pos.unsqueeze(2)).unsqueeze(1)  # [B, 1, Q, kv_len]
        self.cache.bind(lo, hi, write, kv_len)
        kwargs: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
            **kwargs,
        )
        return out.logits[:, -1, :].float()  # [B, V]

    def _sample(self, rows: list[Sequence], logits: torch.Tensor) -> None:
        V = logits.shape[1]
        specs = []
        for s in rows:
            sp = s.sp
            banned: tuple[int, ...] = ()
            if len(s.output_ids) < sp.min_new_tokens:
                banned = tuple(sp.stop_token_ids) + (() if sp.ignore_eos else self.cfg.eos_token_ids)
                banned = tuple(t for t in banned if 0 <= t < V)  # an id outside [0, V) is never drawn
            u = (
                seeded_uniform(sp.sampling_seed, s.n_tokens)
                if sp.sampling_seed is not None
                else self._rng.random()
            )
            specs.append(RowSampling(sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.is_greedy, u, banned))
        try:
            drawn: list[tuple[int, float] | None] = list(zip(*sample_rows(logits, specs), strict=True))
        except Exception:  # one row's parameters must not fail the batch: find it, abort only it
            drawn = [
                self._sample_one(s, logits[i : i + 1], spec)
                for i, (s, spec) in enumerate(zip(rows, specs, strict=True))
            ]
        self._stats["generated_tokens"] += len(rows)
        for s, got in zip(rows, drawn, strict=True):
            if got is None:
                continue  # aborted by _sample_one
            t, lp = got
            if not math.isfinite(lp):  # never reply NaN: a model or parameter problem of this row only
                s.finish = finish_abort(
                    f"the model gave a non-finite logprob ({lp}) for token {t}; request aborted", 500
                )
                continue
            s.output_ids.append(t)
            s.output_logprobs.append(lp)
            sp = s.sp
            is_stop = t in sp.stop_token_ids or (not sp.ignore_eos and t in self.cfg.eos_token_ids)
            if is_stop and len(s.output_ids) >= sp.min_new_tokens:
                s.finish = finish_stop(t)
            if s.finish is None and len(s.output_ids) >= sp.max_new_tokens:
                s.finish = finish_length(sp.max_new_tokens)
            if s.finish is None and s.n_tokens >= self.cfg.context_len:
                s.finish = finish_length(len(s.output_ids))

    def _sample_one(self, s: Sequence, logits: torch.Tensor, spec: RowSampling) -> tuple[int, float] | None:
        """Sample one row alone (after the batch failed); a row that still fails is aborted (400)."""
        try:
            tokens, lps = sample_rows(logits, [spec])
        except Exception as e:
            logger.warning("sampling failed for rid %s, aborting it alone: %s", s.rid, e)
            s.finish = finish_abort(f"sampling failed for this request: {type(e).__name__}: {e}", 400)
            return None
        return tokens[0], lps[0]

    def _remove(self, seqs: list[Sequence]) -> None:
        """Take ``seqs`` out of the running rows, keeping rows contiguous (the last row fills each hole)."""
        gone = {id(s) for s in seqs}
        holes = sorted((r for r, s in enumerate(self._running) if id(s) in gone), reverse=True)
        for r in holes:
            last = len(self._running) - 1
            if r != last:
                moved = self._running[last]
                self.cache.move_row(last, r, moved.cached)
                self._running[r] = moved
            self._running.pop()

    def _abort_where(
        self, pred: Callable[[Sequence], bool], message: str = "Aborted", status: int | None = None
    ) -> int:
        running = [s for s in self._running if pred(s)]
        waiting = [s for s in self._waiting if pred(s)]
        if running:
            self._remove(running)
        if waiting:
            ids = {id(s) for s in waiting}
            self._waiting = deque(s for s in self._waiting if id(s) not in ids)
        for s in running:
            self._deliver(s, finish_abort(message, status))
        for s in waiting:
            self._deliver(
                s, finish_abort("Abort in waiting queue" if message == "Aborted" else message, status)
            )
        self._stats["aborted_requests"] += len(running) + len(waiting)
        return len(running) + len(waiting)

    def _pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self._abort_where(lambda s: True)
        elif mode == "retract":
            for s in reversed(self._running):
                s.cached = 0
                s.n_retractions += 1
                self._waiting.appendleft(s)
            self._running = []
        self._paused = mode
        logger.info("generation paused (mode=%s)", mode)

    def _resume(self) -> None:
        self._paused = None
        logger.info("generation continued")

    def _maybe_apply_pending(self) -> None:
        p = self._pending
        if p is None or (self._running and self._paused is None):
            return  # not paused and requests running: wait for them to finish (SGLang's writer lock)
        self._pending = None
        t0 = time.perf_counter()
        try:
            swap_weights_in_place(self.model, p.tensors)
        except Exception as e:
            p.future.set_exception(e)
            return
        kept = [*self._running, *self._waiting]
        for s in kept:
            if s.output_ids:
                s.version_events.append((self.weight_version, len(s.output_ids)))
        if p.weight_version is not None:
            self.weight_version = p.weight_version
        self._stats["weight_updates"] += 1
        self._stats["last_swap_s"] = time.perf_counter() - t0
        logger.info(
            "weights swapped in %.3fs, weight_version=%s", self._stats["last_swap_s"], self.weight_version
        )
        flushed = True
        if p.flush_cache:
            if self._running:
                flushed = False  # SGLang refuses a flush while requests run; the weights stay swapped
            else:
                self.cache.reset()
        p.future.set_result(SwapResult(len(kept), flushed))

    def _deliver(self, seq: Sequence, finish: dict[str, Any]) -> None:
        n = len(seq.output_ids)
        spans = compute_weight_version_spans(seq.version_events, self.weight_version, n)
        meta: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": finish,
            "prompt_tokens": len(seq.prompt),
            "completion_tokens": n,
            "cached_tokens": 0,
            "reasoning_tokens": 0,
            "num_retractions": seq.n_retractions,
            "weight_version": spans[-1].version,
            "weight_versions": [asdict(sp) for sp in spans],
            "e2e_latency": time.monotonic() - seq.submitted_at,
        }
        if seq.return_logprob:
            detok = self.detokenize if seq.return_text_in_logprobs else None
            meta["output_token_logprobs"] = [
                [lp, t, detok([t], False) if detok else None]
                for lp, t in zip(seq.output_logprobs, seq.output_ids, strict=True)
            ]
            meta["output_token_logprobs_length"] = n
            meta["input_token_logprobs"] = []
        text = self.detokenize(seq.output_ids, seq.sp.skip_special_tokens) if self.detokenize else ""
        if finish.get("type") != "abort":
            self._stats["finished_requests"] += 1
        try:
            seq.on_done({"text": text, "output_ids": list(seq.output_ids), "meta_info": meta})
        except Exception:
            logger.exception("result callback failed for rid %s", seq.rid)

    def _publish_snapshot(self) -> None:
        st = self._stats
        self._snapshot = {
            **st,
            "avg_decode_batch": st["decode_seqs_total"] / st["decode_steps"] if st["decode_steps"] else 0.0,
            "uptime_s": time.monotonic() - self._started_at,
            "num_running_reqs": len(self._running),
            "num_waiting_reqs": len(self._waiting),
            "running_output_tokens": sum(len(s.output_ids) for s in self._running),
            "paused": self._paused,
            "pending_weight_update": self._pending is not None,
            "weight_version": self.weight_version,
            "kv_cache_bytes": self.cache.nbytes(),
            "kv_cache_capacity": self.cache.capacity,
        }
