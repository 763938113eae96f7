"""`ClaimedPrompts`: the rows one rollout worker may run, claimed block by block from storage.

What it is: the iterator the loop feeds to the executor. It yields ``(p, row)`` for global positions
``p = epoch * N + position`` (N rows; epoch ``e`` visits the rows in a permutation seeded by
``(seed, e)``), taken from blocks of ``K`` positions that this worker claimed in the trial's
``ClaimLog`` or adopted from a dead worker. It yields ``None`` when nothing may start now (the next
prompt does not fit the staleness bound) and stops after ``max_epochs`` passes. With a prompt curriculum
(``skips_ahead``, ``rollflow.rollout.prompt_filter``) the block's prompts that will be skipped are decided
before the claim and do not count against the bound: they are released as soon as they are pulled.

The global staleness bound: claims are dense, so every position below the highest one handed out
(``P``) is claimed by some worker. A position ``p`` that will run is handed out only if ``fits(p + 1)``,
which the worker wires to ``StalenessManager.claim_fits`` (the rule, its math and a worked example live
in ``rollflow.api.staleness``): every group that exists or runs anywhere is one of the ``P + 1``
positions, less the released and credited ones, so the check on ``P`` bounds them all. A block is
claimed once its first position fits (``fits(b * K + 1)``); its other positions are checked as they are
pulled. Checking a whole block at the claim (``fits((b + 1) * K)``) is as safe but coarser: with room for
fewer than ``K`` groups (after a rejected or skipped prompt) no block fits, and the rollout held back
exactly the groups the bound allows and a trainer at the edge of the window waits for. A new worker
reads the same log, so it cannot run ahead.

Resume from storage, not from the state file alone. A kill can land between a storage write and the
state put that records it; the storage records decide:

- a block claimed just before the kill, before ``on_claim``'s state put: the state file's ``claim_mark``
  (``claim_mark`` here, the claim log's next block when the state was built) bounds what it knew, and
  ``unrecorded(name, mark)`` finds that worker's claims from the mark on in the claim log, to be adopted
  whole (nothing of such a block ran: its state put comes before its first prompt);
- a group committed just before the kill, before the state put after the commit: its position is still
  open in the state file, but the commit record names it (``CommitRecord.positions``), and ``adopt``
  drops the positions in ``done`` (``GroupLedger.committed_positions``), so it is not generated twice.

What it is not: storage I/O beyond ``ClaimLog`` calls and the ``on_claim`` callback (the loop persists
its state there, so a claimed block is recorded before any of its prompts runs).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from storage.prompt_claims import ClaimLog

logger = logging.getLogger(__name__)


def epoch_order(n_rows: int, seed: int, epoch: int) -> list[int]:
    """The row indices epoch ``epoch`` visits, in order: a permutation seeded by ``(seed, epoch)``.

    A single worker hands out global positions 0, 1, 2, ... so its ``p``-th prompt is
    ``rows[epoch_order(N, seed, p // N)[p % N]]`` (what ``bench.peer`` feeds TRL, in the same order).
    """
    order = list(range(n_rows))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return order


@dataclass
class _Held:
    gen: int  # 0 = claimed by this worker; g >= 1 = adopted through takeover g
    pending: list[int]  # positions not handed out yet, in order
    handed: set[int] = field(default_factory=set)


class ClaimedPrompts:
    """Iterator of ``(p, row)`` or ``None`` (see the module docstring)."""

    def __init__(
        self,
        rows: Sequence[dict],
        *,
        seed: int,
        max_epochs: int | None,
        claims: ClaimLog,
        block_size: int,
        worker: str,
        name: str,
        fits: Callable[[int], bool],
        on_claim: Callable[[], None] = lambda: None,
        max_conflicts_per_call: int = 8,
        skips_ahead: Callable[[Sequence[tuple[int, str]]], int] | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.rows = rows
        self.seed = seed
        self.n = len(rows)
        self.end = None if max_epochs is None else max_epochs * self.n  # first position never handed out
        self.claims = claims
        self.k = block_size
        self.worker, self.name = worker, name
        self._fits = fits
        self._on_claim = on_claim
        self._max_conflicts = max_conflicts_per_call
        self._skips_ahead = skips_ahead
        self._held: dict[int, _Held] = {}
        self._lock = threading.Lock()  # adopt() runs on the loop's sync thread
        self._perm: dict[int, list[int]] = {}
        self._unrecorded: dict[tuple[str, int], list[int]] = {}  # (name, mark) -> blocks found
        self.last: int | None = None  # last position handed out
        self._stopped = False  # the claim log reached max_epochs
        self.claimed = 0  # blocks claimed by this worker
        self.adopted = 0  # blocks adopted

    # --- positions ---------------------------------------------------------------------------------------

    def block_range(self, block: int) -> range:
        lo, hi = block * self.k, (block + 1) * self.k
        return range(lo, hi if self.end is None else min(hi, self.end))

    def row(self, p: int) -> dict:
        epoch, pos = divmod(p, self.n)
        order = self._perm.get(epoch)
        if order is None:
            order = epoch_order(self.n, self.seed, epoch)
            self._perm = {epoch: order}  # one epoch at a time is enough (positions grow)
        return self.rows[order[pos]]

    @property
    def exhausted(self) -> bool:
        """Nothing left to hand out: no pending position and no block left (only with ``max_epochs``)."""
        with self._lock:
            if any(h.pending for h in self._held.values()) or self.end is None:
                return False
        return self._stopped or self.claims.next_block() * self.k >= self.end

    # --- adoption and state ---------------------------------------------------------------------------------

    def adopt(
        self, block: int, gen: int, open_positions: Sequence[int], done: Collection[int] = frozenset()
    ) -> None:
        """Run ``open_positions`` of ``block`` here (after this worker's takeover ``gen`` succeeded), less
        those in ``done`` (committed: the state file that listed them was put before their commit)."""
        with self._lock:
            inside = [p for p in open_positions if p in self.block_range(block)]
            keep = sorted(p for p in inside if p not in done)
            self._held[block] = _Held(gen=gen, pending=keep)
            self.adopted += 1
        logger.info(
            "worker %s adopted block %d (gen %d): %d open position(s)%s",
            self.name,
            block,
            gen,
            len(keep),
            f", {len(inside) - len(keep)} already committed" if len(inside) > len(keep) else "",
        )

    @property
    def claim_mark(self) -> int:
        """The claim log's next block as this worker knows it: every block it claimed is below it."""
        return self.claims.next_block()

    def unrecorded(self, name: str, mark: int | None) -> dict[str, dict[str, Any]]:
        """Blocks worker ``name`` claimed at or after ``mark`` (its state file's ``claim_mark``), as state
        entries with every position open: claims its state file never recorded. ``{}`` if ``mark`` is None
        (a file from before the mark existed). Looked up once per (name, mark)."""
        if mark is None:
            return {}
        found = self._unrecorded.get((name, mark))
        if found is None:
            found = self._unrecorded[(name, mark)] = self.claims.claims_by(name, mark)
            if found:
                logger.warning(
                    "worker %s claimed block(s) %s and stopped before its state file recorded them: they are "
                    "adopted from the claim log",
                    name,
                    found,
                )
        return {str(b): {"gen": 0, "open": list(self.block_range(b))} for b in found}

    def held_state(self, open_keys: set[Any]) -> dict[str, dict[str, Any]]:
        """``{block: {"gen", "open"}}`` for the state file; open = pending + handed and not finished.

        ``open_keys``: positions the executor has running, buffered (not committed) or cancelled.
        Blocks whose positions all finished are forgotten.
        """
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for b, h in list(self._held.items()):
                h.handed = {p for p in h.handed if p in open_keys}
                still = sorted(set(h.pending) | h.handed)
                if not still:
                    del self._held[b]
                    continue
                out[str(b)] = {"gen": h.gen, "open": still}
        return out

    # --- iteration ------------------------------------------------------------------------------------------

    def __iter__(self) -> ClaimedPrompts:
        return self

    def __next__(self) -> tuple[int, dict] | None:
        conflicts = 0
        while True:
            p = self._next_pending()
            if p is not None:
                # a prompt the curriculum skips takes no room (released when pulled); one that runs must fit
                if not self._skipped_in(range(p, p + 1)) and not self._fits(p + 1):
                    return None
                self._take(p)
                return p, self.row(p)
            if conflicts >= self._max_conflicts:
                return None  # many workers raced for the same blocks: try again on the next tick
            b = self.claims.next_block()
            rng = self.block_range(b)
            if not rng:  # past max_epochs
                self._stopped = True
                raise StopIteration
            # the block's skips are drawn now, before the claim; room for its first prompt that runs is
            # enough to claim it, and each prompt is checked as it is pulled (the module docstring)
            if not self._fits(rng.start + min(1, len(rng) - self._skipped_in(rng))):
                return None
            if self.claims.try_claim(b, self.worker, self.name):
                with self._lock:
                    self._held[b] = _Held(gen=0, pending=list(rng))
                    self.claimed += 1
                self._on_claim()
            else:
                conflicts += 1

    def _skipped_in(self, rng: range) -> int:
        """Positions of ``rng`` the prompt filter has decided to skip (they never take capacity)."""
        if self._skips_ahead is None:
            return 0
        return self._skips_ahead([(p, str(self.row(p).get("prompt_id"))) for p in rng])

    def _next_pending(self) -> int | None:
        """The position to hand out next: the lowest held block's first pending one (left in place)."""
        with self._lock:
            for b in sorted(self._held):
                if self._held[b].pending:
                    return self._held[b].pending[0]
        return None

    def _take(self, p: int) -> None:
        """Hand out ``p`` (``_next_pending``'s answer; a block adopted meanwhile does not move it)."""
        with self._lock:
            h = self._held[p // self.k]
            h.pending.remove(p)
            h.handed.add(p)
            self.last = p
