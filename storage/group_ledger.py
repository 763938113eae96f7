"""`GroupLedger`: every writer's committed groups and the credited ones, read incrementally from storage.

What it is: the storage side of the global staleness bound. ``refresh`` returns a ``LedgerView``:

    accepted  = sum of ``groups`` over all readable commit records (every writer)
    credited  = sum over those commits of their credits (``storage.credits``: stale drops, quarantine)
    by_writer = accepted per ``CommitRecord.writer`` (one ShardWriter incarnation)

``committed_positions`` is the set of prompt positions named by the records read so far
(``CommitRecord.positions``): what a worker adopting open blocks skips, since a group committed just
before a kill may still be open in the state file its dead life left.

Credits are listed before commits, and a credit counts only when its commit is counted, so
``0 <= credited <= accepted`` and ``accepted - credited`` never undercounts the groups that may still be
trained. Listing is incremental (``PartitionLister``); each record and document is read once (records
are immutable; a credit document changes only when a restarted trainer decides a commit again, and
such a change is picked up by a new ledger, i.e. at the next rollout restart).

What it is not: a reader of shards, or the capacity formula (``rollflow.api.staleness``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from storage import credits, keys
from storage.commits import CommitRecord
from storage.errors import CorruptShardError
from storage.fs import Storage
from storage.partition_lister import PartitionLister

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerView:
    accepted: int
    credited: int
    by_writer: dict[str, int] = field(default_factory=dict)

    def writer_groups(self, writer_id: str) -> int:
        return self.by_writer.get(writer_id, 0)


class GroupLedger:
    """Sums committed and credited groups across writers; see the module docstring."""

    def __init__(self, storage: Storage, *, hot_window: int = 8, sweep_s: float = 60.0) -> None:
        self.storage = storage
        self.commits = PartitionLister(storage, keys.COMMIT_DIR, hot_window=hot_window, sweep_s=sweep_s)
        self.credit_docs = PartitionLister(
            storage, credits.CREDIT_DIR, hot_window=hot_window, sweep_s=sweep_s
        )
        self._groups: dict[str, tuple[str, int]] = {}  # commit id -> (writer, groups)
        self._credit: dict[str, int] = {}  # commit id -> dropped-stale groups
        self._quarantined: dict[str, int] = {}  # commit id -> groups credited by its quarantine
        self._seen_quarantine: set[str] = set()
        self.committed_positions: set[int] = set()  # prompt positions of every record read

    def refresh(self) -> LedgerView:
        # Credits first: every credit read here belongs to a commit committed before it was written.
        for key in self.credit_docs.poll():
            cid = key.rsplit("/", 1)[-1].removesuffix(".json")
            try:
                self._credit[cid] = len(credits.dropped_indices(self.storage.get_json(key)))
            except FileNotFoundError:
                self.credit_docs.forget(key)
            except ValueError as e:
                logger.warning("ignoring malformed credit document %s: %s", key, e)
        for key in self.storage.list(keys.QUARANTINE_DIR):
            if key in self._seen_quarantine or not key.endswith(".json"):
                continue
            try:
                doc = self.storage.get_json(key)
            except FileNotFoundError:
                continue
            except ValueError:
                doc = None
            self._seen_quarantine.add(key)
            cid = doc.get("commit_id") if isinstance(doc, dict) else None
            if isinstance(cid, str):
                self._quarantined[cid] = credits.quarantine_credit(doc)
        for key in self.commits.poll():
            try:
                rec = CommitRecord.from_json(json.loads(self.storage.get_bytes(key)))
            except FileNotFoundError:
                self.commits.forget(key)
                continue
            except (ValueError, CorruptShardError):
                continue  # unreadable: the trainer quarantines it, and it counts nowhere
            self._groups[rec.commit_id] = (rec.writer, rec.groups)
            self.committed_positions.update(rec.positions or ())
        by_writer: dict[str, int] = {}
        accepted = credited = 0
        for cid, (writer, groups) in self._groups.items():
            by_writer[writer] = by_writer.get(writer, 0) + groups
            accepted += groups
            credited += min(groups, self._credit.get(cid, 0) + self._quarantined.get(cid, 0))
        return LedgerView(accepted, credited, by_writer)
