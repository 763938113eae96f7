"""Capacity credits: the storage record of committed groups that will never be trained.

What it is: the key layout and format of two kinds of evidence the consuming reader (the trainer)
leaves in storage, and how many groups each one credits back to the rollout's staleness capacity:

```
trajectories/credits/v{partition:06d}/{commit_id}.json   groups of one commit dropped as stale
trajectories/quarantine/{commit_id}.json                 a shard that failed verification
```

A credit document holds the dropped group indices of one commit, ``{"commit_id", "dropped": [i, ...]}``;
it credits ``len(dropped)``. It sits in the commit's own partition, so it is listed the same way as the
commit. The reader rewrites it with the drops of its current timeline (after a trainer restart from a
resume point, groups past the cursor are decided again), so it is idempotent, never additive.

A quarantine document credits the groups of the commit that were still unconsumed when it was
quarantined (``credit``; documents written before that field existed credit the whole record).
A quarantine of an unreadable record credits nothing: such a record is not counted as accepted either.

What it is not: the code that decides drops (``shard_reader``) or sums credits (``group_ledger``).
"""

from __future__ import annotations

from typing import Any

from storage import keys

CREDIT_DIR = "trajectories/credits"


def credit_partition(partition: int) -> str:
    """`trajectories/credits/v{partition:06d}`."""
    return f"{CREDIT_DIR}/{keys.version_dir_name(partition)}"


def credit_key(partition: int, commit_id: str) -> str:
    """`trajectories/credits/v{partition:06d}/{commit_id}.json`."""
    return f"{credit_partition(partition)}/{keys.check_name(commit_id, 'commit_id')}.json"


def credit_doc(commit_id: str, dropped: set[int]) -> dict[str, Any]:
    return {"commit_id": commit_id, "dropped": sorted(dropped)}


def dropped_indices(doc: Any) -> set[int]:
    """The dropped group indices of a credit document; ValueError if it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("dropped"), list):
        raise ValueError("not a credit document: needs a 'dropped' list")
    out = set()
    for i in doc["dropped"]:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"credit document: bad group index {i!r}")
        out.add(i)
    return out


def quarantine_credit(doc: Any) -> int:
    """Groups a quarantine document credits back (0 for a malformed one or an unreadable record)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("record"), dict):
        return 0
    groups = doc["record"].get("groups")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 0:
        return 0
    credit = doc.get("credit", groups)
    if isinstance(credit, bool) or not isinstance(credit, int) or not 0 <= credit <= groups:
        return groups
    return credit
