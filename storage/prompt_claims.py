"""`ClaimLog`: prompt blocks claimed by rollout workers with exclusive puts, and takeovers of dead ones.

What it is: the storage protocol that lets many rollout workers share one trial's data exactly once
per epoch and one staleness bound. The prompts of all epochs form one stream of global positions
``p = epoch * N + position`` (N rows). Block ``b`` is the positions ``[b*K, (b+1)*K)``; a worker claims it
with an exclusive put, so exactly one worker owns each block:

```
prompts/claims/{b // 1000:06d}/{b:010d}.json     {"block", "worker", "name", "claimed_at"}
prompts/takeovers/{b:010d}-{gen:03d}.json        block b adopted for generation gen (exclusive)
```

Workers claim the lowest unclaimed block (they learn it from a conflict or a listing), so claims are
dense: after block ``b`` is claimed, exactly ``(b + 1) * K`` positions were ever handed out. That count
is what makes the staleness bound global and exact (see ``rollflow.rollout.prompt_source``).

A dead worker's unfinished positions are adopted, not re-claimed: its blocks stay reserved and the
first worker whose exclusive put of ``takeovers/{b}-{gen+1}`` succeeds runs what was left open, so
no capacity is counted twice and no two workers adopt the same block.

The keys live under `prompts/`, not `rollout/`, so a worker's listing of the state files under
`rollout/` stays one small LIST however many blocks a run claims.

The keys are built in ``storage.keys``. What it is not: liveness (workers' heartbeats are their state
files, ``storage.worker_state``) or the data order (the prompt source maps positions to rows).
"""

from __future__ import annotations

import time

from storage.errors import CommitConflictError
from storage.fs import Storage
from storage.keys import CLAIM_DIR, CLAIMS_PER_DIR, claim_key, takeover_key


class ClaimLog:
    """Claims blocks in order and adopts dead workers' blocks; every write is one exclusive put."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._next: int | None = None  # lowest block that may be unclaimed (a hint)
        self.conflicts = 0
        self._names: dict[int, str] = {}  # block -> the name in its claim (claims never change)

    def next_block(self) -> int:
        """The lowest block not known to be claimed (lists the newest claim directory if unknown)."""
        if self._next is None:
            self._next = self._scan()
        return self._next

    def _scan(self) -> int:
        dirs = [d for d in self.storage.list_dirs(CLAIM_DIR) if d.rsplit("/", 1)[-1].isdigit()]
        if not dirs:
            return 0
        newest = max(dirs, key=lambda d: int(d.rsplit("/", 1)[-1]))
        names = [k.rsplit("/", 1)[-1].removesuffix(".json") for k in self.storage.list(newest)]
        blocks = [int(n) for n in names if n.isdigit()]
        return max(blocks) + 1 if blocks else int(newest.rsplit("/", 1)[-1]) * CLAIMS_PER_DIR

    def claims_by(self, name: str, start: int) -> list[int]:
        """Blocks ``>= start`` whose claim names worker ``name``, ascending: a fresh listing of the claim
        directories from ``start`` on (one LIST each, usually one), and one GET per claim not read before.

        A worker's state file records the claim log's next block (``WorkerState.claim_mark``); its claims
        from there on are the ones killed before the state file said so.
        """
        out: list[int] = []
        for d in self.storage.list_dirs(CLAIM_DIR):
            tail = d.rsplit("/", 1)[-1]
            if not tail.isdigit() or (int(tail) + 1) * CLAIMS_PER_DIR <= start:
                continue
            for key in self.storage.list(d):
                stem = key.rsplit("/", 1)[-1].removesuffix(".json")
                if not stem.isdigit() or int(stem) < start:
                    continue
                block = int(stem)
                if block not in self._names:
                    try:
                        doc = self.storage.get_json(key)
                    except (FileNotFoundError, ValueError):
                        continue
                    self._names[block] = str(doc.get("name", "")) if isinstance(doc, dict) else ""
                if self._names[block] == name:
                    out.append(block)
        return sorted(out)

    def try_claim(self, block: int, worker: str, name: str) -> bool:
        """Exclusive put of ``block``'s claim; False (and the hint moves on) if another worker has it."""
        try:
            self.storage.put_json(
                claim_key(block),
                {"block": block, "worker": worker, "name": name, "claimed_at": time.time()},
                exclusive=True,
            )
        except CommitConflictError:
            self.conflicts += 1
            self._next = max(self._next or 0, block + 1)
            return False
        self._next = max(self._next or 0, block + 1)
        return True

    def try_take_over(self, block: int, gen: int, worker: str) -> bool:
        """Adopt ``block`` for generation ``gen`` (>= 1); False if another worker did first."""
        try:
            self.storage.put_json(
                takeover_key(block, gen),
                {"block": block, "gen": gen, "by": worker, "at": time.time()},
                exclusive=True,
            )
        except CommitConflictError:
            return False
        return True
