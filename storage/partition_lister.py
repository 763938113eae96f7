"""`PartitionLister`: new keys under a version-partitioned prefix, for a LIST cost that stays flat.

What it is: incremental listing of ``{prefix}/v{N:06d}/...`` (commit records, credit documents). Each
``poll`` returns only the keys it has not returned before. Per poll it issues

    1 LIST of the partition names  +  1 LIST per hot partition  +  a sweep of every partition
    once per ``sweep_s``

where the hot partitions are the newest ``hot_window + 1`` (``N >= newest - hot_window``) and any
partition seen for the first time. New records land in the newest partitions (a commit's partition
is its groups' lowest head version, which the staleness bound keeps within ``max_staleness`` of the
trainer's version), so the cost per poll is O(hot_window), not O(all partitions), as a run grows; a
late commit into an older partition (an episode that ran very long) is found by the next sweep.
(On S3 a LIST returns up to 1,000 keys, so a hot partition of up to 1,000 commits is one request.)

``polls`` and ``list_calls`` count what it did, so a test or bench can check the cost.

What it is not: a reader of the objects (callers GET what they need) or an ordering: keys come in
listing order, and callers sort by their own fields.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from storage import keys
from storage.fs import Storage


class PartitionLister:
    """Returns keys under ``prefix``'s ``v{N}`` partitions that it has not returned before."""

    def __init__(
        self,
        storage: Storage,
        prefix: str,
        *,
        suffix: str = ".json",
        hot_window: int = 8,
        sweep_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hot_window < 0:
            raise ValueError(f"hot_window must be >= 0, got {hot_window}")
        if sweep_s <= 0:
            raise ValueError(f"sweep_s must be > 0, got {sweep_s}")
        self.storage = storage
        self.prefix = prefix
        self.suffix = suffix
        self.hot_window = hot_window
        self.sweep_s = sweep_s
        self._clock = clock
        self._seen: set[str] = set()
        self._partitions: set[int] = set()
        self._last_sweep: float | None = None
        self.polls = 0
        self.list_calls = 0

    def poll(self) -> list[str]:
        """Keys not returned before, from the hot partitions (and every partition when a sweep is due)."""
        self.polls += 1
        self.list_calls += 1
        dirs = {}
        for d in self.storage.list_dirs(self.prefix):
            v = keys.parse_version_dir(d)
            if v is not None:
                dirs[v] = d
        if not dirs:
            return []
        now = self._clock()
        sweep = self._last_sweep is None or now - self._last_sweep >= self.sweep_s
        if sweep:
            self._last_sweep = now
        floor = max(dirs) - self.hot_window
        out: list[str] = []
        for v in sorted(dirs):
            if sweep or v >= floor or v not in self._partitions:
                self.list_calls += 1
                for k in self.storage.list(dirs[v]):
                    if k.endswith(self.suffix) and k not in self._seen:
                        self._seen.add(k)
                        out.append(k)
        self._partitions.update(dirs)
        return out

    def forget(self, key: str) -> None:
        """Return ``key`` again from a later poll that lists its partition (it was not usable yet)."""
        self._seen.discard(key)
