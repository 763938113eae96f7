"""`ReaderCursor`: the shard reader's exactly-once state, saved with the trainer's resume point.

What it is: for each commit, how many of its groups were consumed (groups are consumed in file order), and
which of a partly consumed commit's groups were dropped as stale; the ids of the groups it delivered (and
the commit each came in), so a later commit's group with an id already delivered is not delivered again.
The trainer saves `cursor.to_json()` with its resume state and restores it with `ReaderCursor.from_json`,
so nothing is consumed twice and nothing is skipped.
What it is not: the reader (`storage.shard_reader.ShardReader` takes groups and moves the cursor).
"""

from __future__ import annotations

import re
from collections import OrderedDict, defaultdict
from typing import Any

from storage import keys

_COMMIT_ID_RE = re.compile(r"^(?P<writer>.+)-(?P<seq>\d{8,})$")


class ReaderCursor:
    """Exactly-once consumption state: commit id -> number of its groups consumed (in file order).

    Fully consumed commits are kept as a set; `to_json` stores them as seq ranges per writer, so the
    saved cursor stays small over a long run.
    """

    FORMAT = 1
    MAX_REMEMBERED_IDS = 20_000  # delivered group ids kept when no staleness bound prunes them

    def __init__(self) -> None:
        self._partial: dict[str, int] = {}
        self._done: set[str] = set()
        self._dropped: dict[str, set[int]] = {}  # partly consumed commit -> indices dropped as stale
        # group id -> (commit it was delivered from, its head version), oldest delivery first
        self._delivered: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def delivered_in(self, group_id: str) -> str | None:
        """The commit a group with this id was delivered from, or None."""
        seen = self._delivered.get(group_id)
        return seen[0] if seen is not None else None

    def note_delivered(self, group_id: str, commit_id: str, head_version: int) -> None:
        self._delivered[group_id] = (commit_id, head_version)
        while len(self._delivered) > self.MAX_REMEMBERED_IDS:
            self._delivered.popitem(last=False)

    def forget_below(self, min_head_version: int) -> None:
        """Forget delivered ids whose head version is below ``min_head_version`` (module docstring)."""
        old = [g for g, (_, head) in self._delivered.items() if head < min_head_version]
        for g in old:
            del self._delivered[g]

    def position(self, commit_id: str) -> int | None:
        """Groups of `commit_id` consumed so far (0 if untouched), or None once it is fully consumed."""
        return None if commit_id in self._done else self._partial.get(commit_id, 0)

    def consumed(self, commit_id: str, total: int) -> int:
        """Groups of `commit_id` consumed so far, given its total (from the record)."""
        p = self.position(commit_id)
        return total if p is None else p

    @property
    def n_done(self) -> int:
        """Number of fully consumed (or quarantined) commits."""
        return len(self._done)

    def is_done(self, commit_id: str) -> bool:
        return commit_id in self._done

    def advance(self, commit_id: str, n: int, total: int) -> None:
        """Record `n` more groups of `commit_id` consumed; done once `total` are."""
        if commit_id in self._done:
            raise ValueError(f"commit {commit_id} is already fully consumed")
        k = self._partial.get(commit_id, 0) + n
        if k >= total:
            self.finish(commit_id)
        else:
            self._partial[commit_id] = k

    def finish(self, commit_id: str) -> None:
        """Mark a commit fully consumed (also used for quarantined ones)."""
        self._partial.pop(commit_id, None)
        self._dropped.pop(commit_id, None)
        self._done.add(commit_id)

    def dropped(self, commit_id: str) -> set[int]:
        """Indices of `commit_id`'s groups dropped as stale so far (only kept while it is partly consumed)."""
        return set(self._dropped.get(commit_id, ()))

    def note_dropped(self, commit_id: str, indices: set[int]) -> None:
        """Remember stale drops of a commit that stays partly consumed (saved with the cursor)."""
        if indices:
            self._dropped.setdefault(commit_id, set()).update(indices)

    def update(self, other: ReaderCursor) -> None:
        """Replace this cursor's state with `other`'s (in place, so references stay valid)."""
        self._partial = dict(other._partial)
        self._done = set(other._done)
        self._dropped = {k: set(v) for k, v in other._dropped.items()}
        self._delivered = OrderedDict(other._delivered)

    def copy(self) -> ReaderCursor:
        c = ReaderCursor()
        c.update(self)
        return c

    def __len__(self) -> int:
        return len(self._partial) + len(self._done)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ReaderCursor)
            and self._partial == other._partial
            and self._done == other._done
            and self._dropped == other._dropped
            and self._delivered == other._delivered
        )

    def __repr__(self) -> str:
        return f"ReaderCursor(done={len(self._done)}, partial={len(self._partial)})"

    def to_json(self) -> dict[str, Any]:
        by_writer: dict[str, list[int]] = defaultdict(list)
        odd: list[str] = []
        for cid in self._done:
            m = _COMMIT_ID_RE.match(cid)
            if m:
                by_writer[m.group("writer")].append(int(m.group("seq")))
            else:
                odd.append(cid)
        done: dict[str, list[list[int]]] = {}
        for w, seqs in by_writer.items():
            seqs.sort()
            ranges: list[list[int]] = []
            for s in seqs:
                if ranges and s == ranges[-1][1] + 1:
                    ranges[-1][1] = s
                else:
                    ranges.append([s, s])
            done[w] = ranges
        return {
            "format": self.FORMAT,
            "done": dict(sorted(done.items())),
            "done_ids": sorted(odd),
            "partial": dict(sorted(self._partial.items())),
            "partial_dropped": {k: sorted(v) for k, v in sorted(self._dropped.items()) if v},
            # [group id, commit id, head version], oldest delivery first
            "delivered": [[g, c, h] for g, (c, h) in self._delivered.items()],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ReaderCursor:
        if not isinstance(obj, dict) or obj.get("format") != cls.FORMAT:
            raise ValueError(f"not a ReaderCursor v{cls.FORMAT} document")
        c = cls()
        for w, ranges in obj.get("done", {}).items():
            for lo, hi in ranges:
                c._done.update(keys.commit_id(w, s) for s in range(int(lo), int(hi) + 1))
        c._done.update(str(x) for x in obj.get("done_ids", []))
        for cid, n in obj.get("partial", {}).items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"cursor: bad count for {cid!r}: {n!r}")
            c._partial[str(cid)] = n
        for cid, idx in obj.get("partial_dropped", {}).items():
            if not isinstance(idx, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in idx):
                raise ValueError(f"cursor: bad dropped indices for {cid!r}: {idx!r}")
            c._dropped[str(cid)] = set(idx)
        for item in obj.get("delivered", []):  # absent in cursors saved before ids were remembered
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[2], int)):
                raise ValueError(f"cursor: bad delivered entry {item!r}")
            c._delivered[str(item[0])] = (str(item[1]), int(item[2]))
        return c
