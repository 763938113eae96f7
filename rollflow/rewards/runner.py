"""AsyncRewardRunner: score completions with a sync reward function in worker processes, with a timeout.

What it is. ``await runner.ascore(prompt, completion, answer, **data)`` runs the reward function (see
``rollflow.rewards.protocol``) in one of ``max_workers`` long-lived worker processes and returns a
``RewardOutcome(score, error, timed_out)``. It never raises for a bad reward:

* the function raises, or returns a non-number, NaN, inf or ``|r| > 1e6`` (``check_reward``) ->
  score 0.0, ``error`` set: a judgement of the completion;
* it runs longer than ``timeout_s`` -> score 0.0, ``timed_out=True``; that worker is killed (SIGKILL)
  and replaced, so a hung reward never keeps a slot. Other calls in flight are not touched: each
  worker runs one call at a time, which is why this is a small pool of our own rather than
  ``ProcessPoolExecutor`` (which cannot kill one hung task without breaking every other one);
* its worker dies or never starts -> the call is retried on a fresh worker, up to
  ``infra_retries`` times; if it still has no answer, ``infra_error=True``. Reward infrastructure is
  not a reward: a caller must not train on that outcome's 0.0 (``RLVRWorkflow`` drops the group and
  counts it).

Each outcome is counted in ``.stats`` (calls, errors, timeouts, worker restarts) and failures are
logged. ``ascore_many`` scores a group's completions in one round trip to one worker. The timeout
covers the call itself, not the wait for a free worker or a worker's start-up
(which imports the reward module). Workers are started lazily on the first call.

A worker is a plain ``python -m rollflow.rewards.worker`` subprocess, not a ``multiprocessing`` child:
spawn/forkserver children re-run the parent's ``__main__`` (a flow script, a notebook kernel, stdin)
and fork is unsafe next to threads and torch. Calls go over two pipes as one JSON line each - the
function by its import string, arguments as JSON values - so nothing is pickled and the function
must be importable; ``data`` values JSON cannot encode are sent as ``str(value)`` (logged once). The
parent waits on the reply pipe with ``loop.add_reader``: no helper threads (POSIX only). The worker's
stdout/stderr are the parent's, so a reward's prints and logs stay visible.

What it is not: a sandbox. A reward function runs with the rollout process's permissions; use a
container for untrusted code execution rewards.

Usage::

    runner = AsyncRewardRunner("rollflow.rewards.math:gsm8k_reward_fn", max_workers=2, timeout_s=10)
    outcome = await runner.ascore("What is 6*7?", "6*7 = 42. #### 42", "42")   # RewardOutcome(1.0, None, False)
    runner.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rollflow.rewards.protocol import RewardValueError, check_reward, reward_fn_name

logger = logging.getLogger(__name__)

# Read by rollflow.rewards.worker (not imported here: `python -m` would warn that the package
# __init__ imported it before it ran).
SYS_PATH_ENV = "ROLLFLOW_REWARD_SYS_PATH"
_PIPE_BATCH_BYTES = 32 << 10  # one write of a batch must fit the pipe buffer (64 KiB), or it would block
_STARTUP_TIMEOUT_S = 120.0  # importing a heavy reward module (sympy, ...) on a loaded machine


@dataclass(frozen=True)
class RewardOutcome:
    """The result of one reward call. ``score`` is 0.0 whenever ``error`` is set or ``timed_out``.

    ``infra_error``: no worker could answer (it died or never started, retries included), so ``score``
    says nothing about the completion and must not be trained on.
    """

    score: float
    error: str | None = None
    timed_out: bool = False
    infra_error: bool = False


@dataclass(frozen=True)
class _Request:
    """One call as it goes down the pipe (a JSON line without its newline)."""

    id: int
    payload: bytes
    completion: str


@dataclass(frozen=True)
class RewardStats:
    """Counters since the runner was built."""

    calls: int = 0
    errors: int = 0  # raised, returned a bad value, or the worker died (not counting timeouts)
    timeouts: int = 0
    worker_restarts: int = 0  # workers killed on timeout/cancel or found dead, then replaced
    infra_retries: int = 0  # calls sent again to a fresh worker after theirs died or never started
    infra_failures: int = 0  # calls that got no answer after every retry (``infra_error``)


def counted(stats: RewardStats, outcome: RewardOutcome) -> RewardStats:
    """``stats`` with one more call, counted by its outcome (shared with the in-process runner)."""
    return replace(
        stats,
        calls=stats.calls + 1,
        errors=stats.errors + (outcome.error is not None and not outcome.timed_out),
        timeouts=stats.timeouts + outcome.timed_out,
        infra_failures=stats.infra_failures + outcome.infra_error,
    )


class _Worker:
    """One ``python -m rollflow.rewards.worker`` process and the parent's ends of its two pipes."""

    def __init__(self, spec: str, index: int) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = {**os.environ, SYS_PATH_ENV: json.dumps(sys.path)}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rollflow.rewards.worker", spec, str(req_r), str(rep_w)],
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.index = index
        self._out = os.fdopen(req_w, "wb", buffering=0)
        self._in_fd = rep_r
        os.set_blocking(rep_r, False)
        self._buf = bytearray()
        self.ready = False

    def send(self, payload: bytes) -> None:
        self._out.write(payload + b"\n")

    async def arecv(self, timeout_s: float) -> dict[str, Any]:
        """The next message; raises ``TimeoutError`` or ``EOFError`` (the worker is gone)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()

        def on_readable() -> None:
            while not fut.done():
                if b"\n" in self._buf:
                    line, _, rest = bytes(self._buf).partition(b"\n")
                    self._buf[:] = rest
                    fut.set_result(line)
                    return
                try:
                    chunk = os.read(self._in_fd, 1 << 16)
                except BlockingIOError:
                    return
                except OSError as exc:
                    fut.set_exception(EOFError(f"reward worker pipe failed: {exc!r}"))
                    return
                if not chunk:
                    fut.set_exception(EOFError("reward worker exited"))
                    return
                self._buf += chunk

        on_readable()  # a line may already be buffered
        if not fut.done():
            loop.add_reader(self._in_fd, on_readable)
        try:
            raw = await asyncio.wait_for(fut, timeout_s)
        finally:
            loop.remove_reader(self._in_fd)
        return json.loads(raw)  # type: ignore[no-any-return]

    def _close_pipes(self) -> None:
        for close in (self._out.close, lambda: os.close(self._in_fd)):
            with contextlib.suppress(OSError):
                close()

    def kill(self) -> None:
        """SIGKILL now (a hung reward ignores everything else)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5.0)
        self._close_pipes()

    def stop(self) -> None:
        """Graceful: EOF on its requests makes the worker exit; kill it if it does not."""
        self._close_pipes()
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5.0)


def _exit_code(process: subprocess.Popen[bytes], wait_s: float = 2.0) -> int | None:
    """The exit code of a worker whose pipe closed (it may take a moment to be reaped)."""
    try:
        return process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None


def _kill_all(workers: list[_Worker]) -> None:
    """At interpreter exit or garbage collection of an unclosed runner."""
    for worker in list(workers):
        if worker.process.poll() is None:
            worker.process.kill()


class AsyncRewardRunner:
    """Runs ``fn(prompt, completion, answer, **data) -> float`` in worker processes with a timeout.

    Args:
        fn: the reward function, or its import string ``"pkg.module:name"``.
        max_workers: worker processes, i.e. calls that run at once; more calls wait for a free one.
        timeout_s: a call running longer scores 0.0 with ``timed_out=True``; its worker is replaced.
        infra_retries: how many times a call whose worker died (or never started) is sent to a fresh
            worker before its outcome is ``infra_error``.

    Raises:
        WorkflowImportError: ``fn`` cannot be imported by name (a lambda, a nested function, ...).
    """

    def __init__(
        self,
        fn: Callable[..., float] | str,
        *,
        max_workers: int = 2,
        timeout_s: float = 10.0,
        infra_retries: int = 1,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn_name = reward_fn_name(fn)
        self.max_workers = max_workers
        self.timeout_s = float(timeout_s)
        if infra_retries < 0:
            raise ValueError(f"infra_retries must be >= 0, got {infra_retries}")
        self.infra_retries = infra_retries
        self._stats = RewardStats()
        self._workers: list[_Worker] = []
        self._idle: asyncio.Queue[_Worker] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._spawned = itertools.count()
        self._in_flight = 0
        self._closed = False
        self._warned_json = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    @property
    def stats(self) -> RewardStats:
        """A snapshot of the counters."""
        return self._stats

    # --- pool management -----------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        worker = _Worker(self.fn_name, next(self._spawned))
        self._workers.append(worker)
        return worker

    def _retire(self, worker: _Worker, why: str) -> _Worker:
        """Kill ``worker`` and start its replacement (the caller puts that one back in the queue)."""
        logger.warning("reward worker pid %s stopped (%s); starting a new one", worker.process.pid, why)
        worker.kill()
        self._workers.remove(worker)
        self._stats = replace(self._stats, worker_restarts=self._stats.worker_restarts + 1)
        return self._spawn()

    def _idle_queue(self) -> asyncio.Queue[_Worker]:
        loop = asyncio.get_running_loop()
        if self._idle is None or self._loop is not loop:
            if self._in_flight:
                raise RuntimeError("AsyncRewardRunner is in use on another event loop")
            # First use, or a new event loop (asyncio queues belong to one loop): reuse the workers.
            self._loop = loop
            self._idle = asyncio.Queue()
            while len(self._workers) < self.max_workers:
                self._spawn()
            for worker in self._workers:
                self._idle.put_nowait(worker)
        return self._idle

    # --- scoring -------------------------------------------------------------------------------

    def _encode(self, prompt: str, completion: str, answer: Any, data: dict[str, Any]) -> _Request:
        request_id = next(self._ids)
        request = {"id": request_id, "prompt": prompt, "completion": completion, "answer": answer}
        try:
            payload = json.dumps({**request, "data": data}, allow_nan=False).encode()
        except (TypeError, ValueError):
            if not self._warned_json:
                logger.warning(
                    "reward data has values JSON cannot encode (%s); sending them as str(value)",
                    sorted(data),
                )
                self._warned_json = True
            payload = json.dumps({**request, "data": data}, default=str).encode()
        return _Request(request_id, payload, completion)

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> RewardOutcome:
        """Score one completion; never raises for a failing, hanging or dying reward function."""
        return (await self._score([self._encode(prompt, completion, answer, data)]))[0]

    async def ascore_many(
        self, prompt: str, completions: Sequence[str], answer: Any, **data: Any
    ) -> list[RewardOutcome]:
        """Score several completions of one prompt (a GRPO group), in order; never raises.

        The calls go to one worker in one pipe write and the replies are read one by one, each within
        ``timeout_s``: one wake-up of the worker instead of one per completion. If the worker times out
        or dies on one call, that call fails as in ``ascore`` and the calls after it are each sent again
        on their own. Batches larger than the pipe's buffer are sent one call at a time.
        """
        return await self._score([self._encode(prompt, c, answer, data) for c in completions])

    async def _score(self, requests: list[_Request]) -> list[RewardOutcome]:
        """Every request's outcome, in order, after the infrastructure retries; each counted once."""
        outcomes: list[RewardOutcome] = []
        if len(requests) > 1 and sum(len(r.payload) + 1 for r in requests) <= _PIPE_BATCH_BYTES:
            outcomes = await self._run(requests)
        rest = requests[len(outcomes) :]  # one call, too large to batch, or after a loss mid-batch
        for outs in await asyncio.gather(*(self._run([r]) for r in rest)):
            outcomes += outs
        # Reward infrastructure is not a reward: a call whose worker died or never started goes to a
        # fresh worker, up to infra_retries times.
        for _ in range(self.infra_retries):
            failed = [i for i, o in enumerate(outcomes) if o.infra_error]
            if not failed:
                break
            self._stats = replace(self._stats, infra_retries=self._stats.infra_retries + len(failed))
            retried = await asyncio.gather(*(self._run([requests[i]]) for i in failed))
            for i, outs in zip(failed, retried, strict=True):
                outcomes[i] = outs[0]
        for outcome, request in zip(outcomes, requests, strict=True):
            self._count(outcome, request.completion)
        return outcomes

    async def _run(self, requests: list[_Request]) -> list[RewardOutcome]:
        """The outcomes of a prefix of ``requests`` (at least the first) on one idle worker."""
        if self._closed:
            raise RuntimeError("AsyncRewardRunner.ascore called after close()")
        idle = self._idle_queue()
        worker = await idle.get()
        self._in_flight += 1
        try:
            outcomes, worker = await self._attempt(worker, requests)
        except BaseException:
            # Cancelled mid-call: the worker's late reply would be read as the next call's, so replace it.
            worker = self._retire(worker, "call cancelled")
            raise
        finally:
            self._in_flight -= 1
            if self._closed:
                worker.stop()
            else:
                idle.put_nowait(worker)
        return outcomes

    async def _attempt(
        self, worker: _Worker, requests: list[_Request]
    ) -> tuple[list[RewardOutcome], _Worker]:
        """Start ``worker`` if needed, send every request, then read the replies one by one; stops at
        the first call that loses the worker (a dead or unstartable worker is replaced)."""
        if not worker.ready:
            try:
                hello = await worker.arecv(_STARTUP_TIMEOUT_S)
            except (asyncio.TimeoutError, TimeoutError, EOFError) as exc:
                hello = {"error": f"reward worker did not start: {exc!r}"}
            if "error" in hello:
                worker = self._retire(worker, "start-up failed")
                return [RewardOutcome(0.0, error=str(hello["error"]), infra_error=True)], worker
            worker.ready = True
        try:
            worker.send(b"\n".join(r.payload for r in requests))
        except OSError as exc:
            return [await self._lost(worker, exc)], self._retire(worker, "worker died")
        outcomes: list[RewardOutcome] = []
        for request in requests:
            outcome, replacement = await self._reply(worker, request.id)
            outcomes.append(outcome)
            if replacement is not worker:
                return outcomes, replacement
        return outcomes, worker

    async def _lost(self, worker: _Worker, exc: BaseException) -> RewardOutcome:
        code = await asyncio.to_thread(_exit_code, worker.process)
        return RewardOutcome(0.0, error=f"reward worker died (exit code {code}): {exc!r}", infra_error=True)

    async def _reply(self, worker: _Worker, request_id: int) -> tuple[RewardOutcome, _Worker]:
        t0 = time.monotonic()
        try:
            reply = await worker.arecv(self.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):  # distinct classes on Python 3.10
            worker = self._retire(worker, f"reward call exceeded {self.timeout_s:g} s")
            return RewardOutcome(0.0, error=f"timed out after {self.timeout_s:g} s", timed_out=True), worker
        except (EOFError, OSError) as exc:
            outcome = await self._lost(worker, exc)
            return outcome, self._retire(worker, "worker died")
        if reply.get("id") != request_id:  # cannot happen unless the protocol is broken; be loud
            worker = self._retire(worker, "reply to another request")
            return RewardOutcome(0.0, error=f"reward worker answered request {reply.get('id')}"), worker
        if "error" in reply:
            return RewardOutcome(0.0, error=str(reply["error"])), worker
        try:
            score = check_reward(reply.get("score"))  # the worker checked it; JSON could still say NaN
        except RewardValueError as exc:
            return RewardOutcome(0.0, error=str(exc)), worker
        logger.debug("reward %.3f in %.4f s", score, time.monotonic() - t0)
        return RewardOutcome(score), worker

    def _count(self, outcome: RewardOutcome, completion: str) -> None:
        self._stats = counted(self._stats, outcome)
        if outcome.infra_error:
            logger.error("reward %s got no answer from any worker: %s", self.fn_name, outcome.error)
        elif outcome.timed_out:
            logger.warning("reward %s timed out (completion %r...); scored 0", self.fn_name, completion[:60])
        elif outcome.error is not None:
            logger.warning("reward %s failed; scored 0: %s", self.fn_name, outcome.error.strip()[-800:])

    # --- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers. Idempotent; calls still in flight stop their worker when they finish."""
        if self._closed:
            return
        self._closed = True
        busy = self._in_flight > 0
        idle: list[_Worker] = []
        if self._idle is not None:
            while not self._idle.empty():
                idle.append(self._idle.get_nowait())
        for worker in self._workers if not busy else idle:
            worker.stop()
        if not busy:
            self._finalizer.detach()
        logger.debug("reward runner closed: %s", self._stats)

    async def __aenter__(self) -> AsyncRewardRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
