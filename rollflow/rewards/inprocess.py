"""In-process rewards: a reward function defined in a notebook or script, called in the rollout's process.

What it is. ``AsyncRewardRunner`` calls a reward in worker processes by its import string, so a function
defined in a notebook cell (module ``__main__``), a lambda or a closure cannot be used there.
``register_reward(fn)`` gives such a callable an import string, ``"rollflow.rewards.inprocess:<name>"``,
that resolves in this process only (the module's ``__getattr__`` looks it up in a registry), and
``reward_runner_for(spec, ...)`` returns an ``InProcessRewardRunner`` for it: the same scoring interface
as ``AsyncRewardRunner`` (``ascore``, ``ascore_many``, ``stats``, ``close``), with calls run on threads
of this process, at most ``max_workers`` at once, each with the timeout.

The trade-offs, stated (docs/python_api.md):

* a reward that times out scores 0.0 and is counted like a worker's, but its thread cannot be killed:
  it is abandoned (a daemon thread) and its slot is given to the next call;
* the reward shares the process (and Python's GIL) with the rollout loop, so a slow pure-Python reward
  slows generation's bookkeeping; move it to a module for worker processes when it is heavy;
* the name means nothing in another process: a reward worker, a deployment's flow run or a rollout
  process started on its own refuse it with ``InProcessRewardError``, which says what to do.

What it is not: a sandbox, or a way to send a function to another machine (nothing is pickled).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rollflow.api.errors import WorkflowImportError
from rollflow.rewards.protocol import RewardValueError, check_reward
from rollflow.rewards.runner import AsyncRewardRunner, RewardOutcome, RewardStats, counted

logger = logging.getLogger(__name__)

MODULE = __name__
_REGISTRY: dict[str, Callable[..., float]] = {}
_LOCK = threading.Lock()
_COUNTER = itertools.count(1)


class InProcessRewardError(WorkflowImportError):
    """An in-process reward's name was used where its function does not exist (another process)."""


def register_reward(fn: Callable[..., float]) -> str:
    """The import string under which ``fn`` resolves in this process (registering it once).

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"reward_fn must be callable, got {fn!r}")
    with _LOCK:
        for name, known in _REGISTRY.items():
            if known is fn:
                return f"{MODULE}:{name}"
        base = re.sub(r"\W", "_", getattr(fn, "__name__", "reward")) or "reward"
        name = f"{base}__{next(_COUNTER)}"
        _REGISTRY[name] = fn
    return f"{MODULE}:{name}"


def is_in_process(spec: str | Callable[..., float]) -> bool:
    """Whether ``spec`` names an in-process reward (registered here or not)."""
    return isinstance(spec, str) and spec.strip().startswith(f"{MODULE}:")


def lookup(spec: str) -> Callable[..., float]:
    """The function registered under ``spec``.

    Raises:
        InProcessRewardError: nothing is registered under it in this process.
    """
    name = spec.strip().split(":", 1)[1]
    with _LOCK:
        fn = _REGISTRY.get(name)
    if fn is None:
        raise InProcessRewardError(
            f"reward {spec!r} was defined in another Python process (a notebook or script) and lives "
            "only there; run the flow in that process (RLRun.train), or define the reward at the top "
            "level of an importable module and pass 'pkg.module:name'"
        )
    return fn


def __getattr__(name: str) -> Any:  # import_string("rollflow.rewards.inprocess:<name>")
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return lookup(f"{MODULE}:{name}")
    except InProcessRewardError as exc:
        raise AttributeError(str(exc)) from None


class InProcessRewardRunner:
    """Scores with a registered callable on this process's threads; never raises for a bad reward.

    Args:
        spec: the name ``register_reward`` returned.
        max_workers: calls that run at once (threads); more wait for a free slot.
        timeout_s: a call running longer scores 0.0 with ``timed_out=True``; its thread is abandoned.
    """

    def __init__(self, spec: str, *, max_workers: int = 2, timeout_s: float = 10.0) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.fn_name = spec
        self.fn = lookup(spec)
        self.max_workers = max_workers
        self.timeout_s = float(timeout_s)
        self._stats = RewardStats()
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def stats(self) -> RewardStats:
        return self._stats

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.max_workers)
        return self._slots

    async def ascore(self, prompt: str, completion: str, answer: Any, **data: Any) -> RewardOutcome:
        return (await self.ascore_many(prompt, [completion], answer, **data))[0]

    async def ascore_many(
        self, prompt: str, completions: Sequence[str], answer: Any, **data: Any
    ) -> list[RewardOutcome]:
        """Every completion's outcome, in order; calls run concurrently up to ``max_workers``."""
        if self._closed:
            raise RuntimeError("InProcessRewardRunner.ascore called after close()")
        return list(await asyncio.gather(*(self._one(prompt, c, answer, data) for c in completions)))

    async def _one(self, prompt: str, completion: str, answer: Any, data: dict[str, Any]) -> RewardOutcome:
        loop = asyncio.get_running_loop()
        async with self._semaphore():
            done: asyncio.Future[RewardOutcome] = loop.create_future()

            def call() -> None:
                try:
                    outcome = RewardOutcome(check_reward(self.fn(prompt, completion, answer, **data)))
                except RewardValueError as exc:
                    outcome = RewardOutcome(0.0, error=str(exc))
                except Exception as exc:  # a failing reward is a judgement of the completion
                    outcome = RewardOutcome(0.0, error=f"{type(exc).__name__}: {exc}")
                if not loop.is_closed():
                    loop.call_soon_threadsafe(lambda: done.done() or done.set_result(outcome))

            threading.Thread(target=call, name="inprocess-reward", daemon=True).start()
            try:
                outcome = await asyncio.wait_for(asyncio.shield(done), self.timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                outcome = RewardOutcome(0.0, error=f"timed out after {self.timeout_s:g} s", timed_out=True)
        self._count(outcome, completion)
        return outcome

    def _count(self, outcome: RewardOutcome, completion: str) -> None:
        self._stats = counted(self._stats, outcome)
        if outcome.timed_out:
            logger.warning(
                "reward %s timed out (completion %r...); scored 0, its thread abandoned",
                self.fn_name,
                completion[:60],
            )
        elif outcome.error is not None:
            logger.warning("reward %s failed; scored 0: %s", self.fn_name, outcome.error[-800:])

    def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> InProcessRewardRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def reward_runner_for(
    spec: str | Callable[..., float], *, max_workers: int = 2, timeout_s: float = 10.0
) -> AsyncRewardRunner | InProcessRewardRunner:
    """The runner for a reward: in-process for a registered name, worker processes otherwise."""
    if is_in_process(spec):
        assert isinstance(spec, str)
        return InProcessRewardRunner(spec, max_workers=max_workers, timeout_s=timeout_s)
    return AsyncRewardRunner(spec, max_workers=max_workers, timeout_s=timeout_s)
