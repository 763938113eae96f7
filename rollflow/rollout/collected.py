"""`CollectedGroups`: accepted groups an executor keeps for ``await_results``, and who waits for them.

What it is: a FIFO of accepted ``TrajectoryGroup``s and the futures of callers waiting for ``count`` of
them, touched only on the executor's event-loop thread. A waiter is woken once enough groups are in;
``fail(exc)`` raises ``exc`` in every waiter (the executor failed or closed).

What it is not: the writer path (accepted groups normally go to the shard writer; an executor keeps
them here only with ``collect``) or any judgement of groups (``episode_judge``).
"""

from __future__ import annotations

import asyncio
import collections

from storage.schema import TrajectoryGroup


class CollectedGroups:
    """Accepted groups, oldest first, and the callers waiting for them (loop thread only)."""

    def __init__(self) -> None:
        self._groups: collections.deque[TrajectoryGroup] = collections.deque()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: TrajectoryGroup) -> None:
        """Keep ``group`` and wake every waiter whose count is now met."""
        self._groups.append(group)
        for count, waiter in self._waiters:
            if count <= len(self._groups) and not waiter.done():
                waiter.set_result(None)

    async def take(self, count: int, timeout: float | None) -> list[TrajectoryGroup]:
        """Pop ``count`` groups, waiting up to ``timeout`` s for them (``TimeoutError`` otherwise)."""
        if len(self._groups) < count:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((count, waiter))
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            finally:
                self._waiters = [(c, w) for c, w in self._waiters if w is not waiter]
        return [self._groups.popleft() for _ in range(count)]

    def fail(self, exc: BaseException) -> None:
        """Raise ``exc`` in every caller still waiting."""
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(exc)
        self._waiters = []
