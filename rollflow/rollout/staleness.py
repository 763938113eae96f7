"""StalenessManager: the rollout's counters under the staleness rule.

The rule itself, its formulas and worked examples are ``rollflow.api.staleness`` (change the rule there
and nowhere else; import its functions from there). Who applies which: the executor starts an episode
only while ``capacity(v) > 0`` (``try_submit``) and rejects a finished group when
``is_stale(head, min_trainable_version(expected_consumer(v)))`` (``acceptance_bound``); the prompt source
hands out a prompt only if ``claim_fits``; a graceful stop's saved partial episodes are judged by
the same acceptance bound; the trainer at version ``v`` drops groups with
``is_stale(head, min_trainable_version(v))``.

The counters. ``live = (accepted_G - credited_G) + (accepted_local - evicted - own_visible)``.
``accepted_G`` and ``credited_G`` are read from storage by ``sync`` (every writer's committed groups,
and the groups of them that will never be trained: dropped stale by the trainer or quarantined);
``own_visible`` is how many of this process's accepted groups that snapshot already holds, so the last
term is this process's accepted groups not yet visible in storage (buffered, or committed after the
snapshot), less those the shard writer evicted as invalid. With one writer and no credits ``live`` is
just ``accepted``. Other workers' running episodes are not seen here: with many workers the exact global
rule is the claim gate (``claim_fits``, applied by ``rollflow.rollout.prompt_source``): claims are dense,
so a prompt at global position ``p`` starts only if ``claim_fits(p + 1)``: every prompt ever started, by
any worker, is among the ``reserved = P + 1`` positions up to the highest one started (``P``), and each is
now unstarted, running, buffered, committed or ``released`` (rejected, failed, evicted: every worker
publishes its count). ``released`` and ``credited`` are read from storage and can only lag (undercount),
which errs on the safe side. Blocks of ``K`` prompts are claimed in storage, but the gate counts prompts:
a block is claimed once its first prompt fits, so room for fewer than ``K`` groups is still used.

``version`` is read through ``version_fn`` or passed explicitly. After a restart,
``restore(accepted=..., credited=...)`` seeds the counters from what storage already holds; resetting
them to 0 would let the rollout run up to ``max_samples`` groups ahead of the trainer again (AReaL bug
#1388: unbounded staleness after recovery). Why credits matter: a group that is accepted but never
trained still counts in ``accepted``; without the credit, once such groups exceed ``S * B`` the room
stays <= 0 for good (with ``S = 0`` one quarantined shard is enough) and the trainer starves.

What it is not: it starts nothing and reads no storage; the executor asks it and reports events to it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from rollflow.api.staleness import (
    capacity,
    claim_fits,
    expected_consumer,
    is_stale,
    max_samples,
    min_trainable_version,
    staleness_room,
)

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutStat",
    "StalenessListener",
    "StalenessManager",
]

StalenessEvent = Literal["enqueued", "submitted", "accepted", "rejected", "restored"]


@dataclass(frozen=True)
class RolloutStat:
    """A consistent snapshot of the counters. ``enqueued``/``submitted``/``accepted``/``rejected`` only grow."""

    enqueued: int = 0  # handed to the executor (cumulative)
    submitted: int = 0  # started as an episode (cumulative)
    running: int = 0  # started and not yet accepted or rejected (gauge)
    accepted: int = 0  # groups kept, including those restored from storage (cumulative)
    rejected: int = 0  # episodes that ended without a kept group: None, filtered, stale or raised

    @property
    def waiting(self) -> int:
        """Enqueued but not started."""
        return self.enqueued - self.submitted


class StalenessListener(Protocol):
    """Called after every event with the counters after it and the version the manager last saw."""

    def __call__(self, event: StalenessEvent, stat: RolloutStat, version: int) -> None: ...


class StalenessManager:
    """Capacity = min(concurrency room, staleness room); see the module docstring for the formula."""

    def __init__(
        self,
        max_concurrent: int,
        max_staleness: int,
        consumer_batch_size: int,
        *,
        version_fn: Callable[[], int] | None = None,
        listeners: Iterable[StalenessListener] = (),
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if consumer_batch_size < 1:
            raise ValueError(f"consumer_batch_size must be >= 1 group, got {consumer_batch_size}")
        self.max_concurrent = max_concurrent
        self.max_staleness = max_staleness
        self.consumer_batch_size = consumer_batch_size
        self._version_fn = version_fn
        self._listeners: list[StalenessListener] = list(listeners)
        self._lock = threading.Lock()
        self._stat = RolloutStat()
        self._last_version = 0
        # Global view (see the module docstring); without a sync they reduce to the local counters.
        self._restored = 0  # accepted groups restored at start (already in storage then)
        self._global_accepted = 0
        self._global_credited = 0
        self._own_visible = 0
        self._evicted = 0

    # --- reading ---------------------------------------------------------------------------------------

    @property
    def stat(self) -> RolloutStat:
        with self._lock:
            return self._stat

    @property
    def last_version(self) -> int:
        """The version used by the latest capacity check (or event)."""
        with self._lock:
            return self._last_version

    def current_version(self, version: int | None = None) -> int:
        """``version`` if given, else ``version_fn()``; a manager without ``version_fn`` needs it given."""
        if version is None:
            if self._version_fn is None:
                raise ValueError("StalenessManager has no version_fn; pass the trainer version explicitly")
            version = int(self._version_fn())
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        return version

    def max_samples(self, version: int) -> int:
        """``(max_staleness + version + 1) * consumer_batch_size``: groups that may ever exist at ``version``."""
        return max_samples(version, max_staleness=self.max_staleness, batch_size=self.consumer_batch_size)

    def claim_fits(self, reserved: int, *, released: int, credited: int, version: int) -> bool:
        """``reserved - released - credited <= max_samples(version)``: may a worker start the prompt at
        global position ``reserved - 1`` (``rollflow.rollout.prompt_source``; see the module docstring)."""
        return claim_fits(
            reserved, released=released, credited=credited, max_samples=self.max_samples(version)
        )

    def get_capacity(self, version: int | None = None) -> int:
        """Episodes that may start now (may be <= 0). See the module docstring."""
        v = self.current_version(version)
        with self._lock:
            self._last_version = v
            return self._capacity_locked(v)

    @property
    def live(self) -> int:
        """Groups that exist or will, and may still be trained: ``live`` in the module docstring."""
        with self._lock:
            return self._live_locked()

    @property
    def credited(self) -> int:
        """Groups credited back: never trained (storage's count at the last sync) or evicted here."""
        with self._lock:
            return self._global_credited + self._evicted

    @property
    def accepted_total(self) -> int:
        """Groups accepted by every writer as far as this process knows: storage's count at the last sync
        plus this process's accepted groups not yet visible there (evicted ones excluded)."""
        with self._lock:
            return self._global_accepted + self._local_unseen_locked()

    def _local_unseen_locked(self) -> int:
        return max(0, self._stat.accepted - self._restored - self._evicted - self._own_visible)

    def _live_locked(self) -> int:
        return self._global_accepted - self._global_credited + self._local_unseen_locked()

    def staleness_room(self, version: int | None = None) -> int:
        """Episodes the staleness bound alone would let start now (<= 0: the bound holds them back)."""
        v = self.current_version(version)
        with self._lock:
            return self._staleness_room_locked(v)

    def _staleness_room_locked(self, v: int) -> int:
        return staleness_room(self.max_samples(v), live=self._live_locked(), running=self._stat.running)

    def _capacity_locked(self, v: int) -> int:
        return capacity(self.max_concurrent, running=self._stat.running, room=self._staleness_room_locked(v))

    def expected_consumer_version(self, version: int | None = None) -> int:
        """Lowest trainer version at which the NEXT accepted group can be consumed (oldest-first trainer).

        ``max(version, live // B)``: ``live`` trainable groups are ahead of it in the queue, and a
        trainer that consumes B per step reaches group index k at version k // B (or later).
        """
        v = self.current_version(version)
        with self._lock:
            return expected_consumer(v, live=self._live_locked(), batch_size=self.consumer_batch_size)

    def acceptance_bound(self, version: int | None = None) -> int:
        """``min_trainable_version(expected_consumer_version(version))``: the oldest head version a group
        accepted now may have (an older one would be dropped by the trainer anyway)."""
        expected = self.expected_consumer_version(version)
        return min_trainable_version(expected, max_staleness=self.max_staleness)

    def is_stale(self, head_version: int, version: int | None = None) -> bool:
        """Would a group with ``head_version`` finishing now be dropped as stale (``acceptance_bound``)?"""
        return is_stale(head_version, self.acceptance_bound(version))

    # --- events ----------------------------------------------------------------------------------------

    def add_listener(self, listener: StalenessListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _emit(self, event: StalenessEvent, stat: RolloutStat, version: int) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, stat, version)
            except Exception:  # a broken listener must not break accounting
                logger.exception("staleness listener failed on %s", event)

    def _update(self, event: StalenessEvent, **delta: int) -> RolloutStat:
        with self._lock:
            s = self._stat
            new = RolloutStat(
                enqueued=s.enqueued + delta.get("enqueued", 0),
                submitted=s.submitted + delta.get("submitted", 0),
                running=s.running + delta.get("running", 0),
                accepted=s.accepted + delta.get("accepted", 0),
                rejected=s.rejected + delta.get("rejected", 0),
            )
            if new.running < 0:
                raise RuntimeError(f"on_rollout_{event} without a running episode (counters {s})")
            self._stat = new
            version = self._last_version
        self._emit(event, new, version)
        return new

    def on_rollout_enqueued(self, n: int = 1) -> None:
        self._update("enqueued", enqueued=n)

    def on_rollout_submitted(self) -> None:
        """An episode started. Prefer ``try_submit``, which checks capacity in the same critical section."""
        self._update("submitted", submitted=1, running=1)

    def on_rollout_accepted(self) -> None:
        self._update("accepted", running=-1, accepted=1)

    def on_rollout_rejected(self) -> None:
        self._update("rejected", running=-1, rejected=1)

    def on_evicted(self, n: int = 1) -> None:
        """``n`` accepted groups were evicted by the shard writer (invalid): they will never exist."""
        if n < 0:
            raise ValueError(f"on_evicted needs n >= 0, got {n}")
        with self._lock:
            self._evicted += n
        logger.info("%d evicted group(s) credited back to the staleness capacity", n)

    def sync(self, *, accepted: int, credited: int, own_visible: int) -> None:
        """Take storage's view: ``accepted`` groups committed by all writers, ``credited`` of them never
        to be trained, and ``own_visible`` of this process's accepted groups among them. Read credits
        before commits, so every credited group is among the counted ones and ``accepted - credited``
        never undercounts.
        """
        if min(accepted, credited, own_visible) < 0 or credited > accepted:
            raise ValueError(
                f"sync needs 0 <= credited <= accepted and counts >= 0, got accepted={accepted} "
                f"credited={credited} own_visible={own_visible}"
            )
        with self._lock:
            self._global_accepted = accepted
            self._global_credited = credited
            self._own_visible = own_visible

    def try_submit(self, version: int | None = None) -> bool:
        """Atomically: if capacity > 0, count one submitted episode and return True; else False."""
        v = self.current_version(version)
        with self._lock:
            self._last_version = v
            if self._capacity_locked(v) <= 0:
                return False
            s = self._stat
            new = RolloutStat(s.enqueued, s.submitted + 1, s.running + 1, s.accepted, s.rejected)
            self._stat = new
        self._emit("submitted", new, v)
        return True

    def restore(self, *, accepted: int, rejected: int = 0, credited: int = 0) -> None:
        """Seed the counters after a restart from what storage shows (never reset to 0, bug #1388).

        ``accepted``: groups already committed by this trial's writers; ``credited``: how many of them
        will never be trained (see ``sync``); ``rejected``: from the persisted rollout state
        (informational only; it does not enter the capacity).
        """
        if accepted < 0 or rejected < 0 or not 0 <= credited <= accepted:
            raise ValueError(
                f"restore needs counts >= 0 and credited <= accepted, got accepted={accepted} "
                f"rejected={rejected} credited={credited}"
            )
        with self._lock:
            if self._stat.running:
                raise RuntimeError(
                    f"restore() with {self._stat.running} episodes running; call it before start"
                )
            self._stat = RolloutStat(
                enqueued=accepted + rejected,
                submitted=accepted + rejected,
                running=0,
                accepted=accepted,
                rejected=rejected,
            )
            self._restored = self._global_accepted = accepted
            self._global_credited, self._own_visible, self._evicted = credited, 0, 0
            new, version = self._stat, self._last_version
        logger.log(  # a fresh start restores zeros: not worth a line
            logging.INFO if accepted or credited or rejected else logging.DEBUG,
            "staleness counters restored: accepted=%d credited=%d rejected=%d",
            accepted,
            credited,
            rejected,
        )
        self._emit("restored", new, version)
