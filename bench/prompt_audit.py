"""Prompt audit: account for every prompt position of a trial from its storage alone.

What it is. ``audit_trial(storage, rows, seed=..., block_size=...)`` returns an ``Audit``: per prompt
position,

    positions handed out = committed + dropped (a recorded drop) + open at the end (in a state file)

with the positions generated twice into committed shards, the groups trained twice or trained without
being committed, and whether the final checkpoint and ``FINALIZED.json`` are there. ``audit_config``
does the same for the trial a config names. ``bench.kill_audit`` runs it after stopping a real run many
times; its ``--audit-only`` mode runs it on any trial.

What storage says, and what it does not (the facts used):
- handed out: every position of every claimed block (``prompts/claims/``, dense from block 0);
- committed: the groups of every shard a commit record names (size and sha256 checked). The rollout
  loop's records name each group's position (``CommitRecord.positions``): those are matched by position,
  exactly, even where the prompt review ran another prompt in a slot. For records without positions
  (older writers) the position is recovered from the row's ``prompt_id`` by replaying the data order
  (``epoch_order(N, seed, epoch)``), which needs the config's seed, dataset and claim block size. Those
  are not on storage (the resolved config goes to MLflow), so the audit takes them from the config;
- dropped: only a count per worker (``released`` in ``rollout/state-{name}.json``: rejected as stale,
  filtered, empty, skipped, failed or evicted). No record says which position was dropped or why, so
  drops are matched by count against the positions that are neither committed nor open;
- open at the end: the ``blocks`` of every rollout state file (claimed or adopted, not finished: a
  resume would adopt them);
- trained: ``trainer/consumed/step-*.json`` (group ids per step), steps 1 .. ``trainer/DONE.json``'s
  version; stale drops by the trainer are credit documents (``trajectories/credits/``).

What it is not: a writer (it never quarantines or repairs; unreadable things become ``problems``), or a
check of the data itself (rewards, tokens, staleness).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollflow.trial.store import open_trial_storage

CONSUMED_DIR = "trainer/consumed"


@dataclass
class Audit:
    """What storage says about every prompt position of a trial (see the module docstring)."""

    positions_handed_out: int = 0
    positions_committed: int = 0
    positions_dropped: int = 0  # recorded drops matched to positions neither committed nor open
    positions_open_at_end: int = 0
    positions_unaccounted: int = 0  # handed out, and not committed, dropped or open
    positions_generated_twice: int = 0  # extra committed groups for a position
    drops_recorded: int = 0  # sum of ``released`` over the rollout state files
    drops_unmatched: int = 0  # recorded drops with no position left to account for (a position counted twice)
    groups_committed: int = 0
    groups_committed_twice: int = 0  # one group id in two commits
    groups_unclaimed: int = 0  # committed groups whose prompt was never handed out
    groups_trained: int = 0
    groups_trained_twice: int = 0
    groups_trained_not_committed: int = 0
    groups_dropped_stale_by_trainer: int = 0
    commits: int = 0
    commits_quarantined: int = 0
    blocks_claimed: int = 0
    blocks_adopted: int = 0  # takeover records
    final_version: int = -1
    final_committed: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad = (
            self.positions_unaccounted + self.positions_generated_twice + self.drops_unmatched
            + self.groups_committed_twice + self.groups_unclaimed + self.groups_trained_twice
            + self.groups_trained_not_committed
        )  # fmt: skip
        return bad == 0 and self.final_committed and not self.problems


def _json(storage: Any, key: str) -> Any:
    try:
        return storage.get_json(key)
    except (FileNotFoundError, ValueError):
        return None


def _committed_groups(storage: Any, audit: Audit) -> list[tuple[str, str, int | None]]:
    """``(group_id, prompt_id, position)`` of every group of every committed shard, checked against its
    record; the position is the record's (None when it names none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage import keys
    from storage.commits import CommitRecord

    quarantined = {k.rsplit("/", 1)[-1].removesuffix(".json") for k in storage.list(keys.QUARANTINE_DIR)}
    out: list[tuple[str, str, int | None]] = []
    for key in storage.list(keys.COMMIT_DIR):
        if not key.endswith(".json"):
            continue
        try:
            rec = CommitRecord.from_json(json.loads(storage.get_bytes(key)))
        except Exception as e:  # any unreadable record is a finding, not a crash
            audit.problems.append(f"commit record {key} is unreadable: {e}")
            continue
        audit.commits += 1
        audit.commits_quarantined += rec.commit_id in quarantined
        try:
            data = storage.get_bytes(rec.shard_key)
        except FileNotFoundError:
            audit.problems.append(
                f"commit {rec.commit_id}: shard {rec.shard_key} is missing ({rec.groups} groups)"
            )
            continue
        if len(data) != rec.size or hashlib.sha256(data).hexdigest() != rec.sha256:
            audit.problems.append(f"commit {rec.commit_id}: shard size or sha256 differs from its record")
            continue
        table = pq.read_table(pa.BufferReader(data), columns=["group_id", "prompt_id"])
        group_ids, prompt_ids = table.column("group_id").to_pylist(), table.column("prompt_id").to_pylist()
        groups = dict(zip(group_ids, prompt_ids, strict=True))  # rows of one group share both, in file order
        if len(groups) != rec.groups:
            audit.problems.append(f"commit {rec.commit_id}: {len(groups)} groups, record says {rec.groups}")
        at = rec.positions if rec.positions is not None and len(rec.positions) == len(groups) else None
        out += [(g, pid, None if at is None else at[i]) for i, (g, pid) in enumerate(groups.items())]
    return out


def audit_trial(
    storage: Any, rows: Sequence[dict[str, Any]], *, seed: int, block_size: int, max_epochs: int | None = None
) -> Audit:
    """Account for every prompt position of the trial in ``storage`` (a ``storage.fs.Storage``).

    ``rows``, ``seed``, ``block_size`` (``min(rollout.claim_block_size, train.batch_size)``) and
    ``max_epochs`` are the run's config: they map positions to prompts, which storage does not record.
    """
    from rollflow.rollout.prompt_source import epoch_order
    from storage import credits, keys
    from storage.keys import CLAIM_DIR, TAKEOVER_DIR

    audit = Audit()
    n = len(rows)
    end = None if max_epochs is None else max_epochs * n
    orders: dict[int, list[int]] = {}

    def prompt_of(p: int) -> str:
        epoch, pos = divmod(p, n)
        if epoch not in orders:
            orders[epoch] = epoch_order(n, seed, epoch)
        return str(rows[orders[epoch][pos]]["prompt_id"])

    # handed out: the positions of the claimed blocks (claims are dense, so a gap is a lost record)
    blocks = set()
    for key in storage.list(CLAIM_DIR):
        doc = _json(storage, key)
        if not isinstance(doc, dict) or not isinstance(doc.get("block"), int):
            audit.problems.append(f"claim {key} is unreadable")
            continue
        blocks.add(doc["block"])
    audit.blocks_claimed = len(blocks)
    if blocks and blocks != set(range(max(blocks) + 1)):
        gaps = sorted(set(range(max(blocks) + 1)) - blocks)
        audit.problems.append(f"claims are not dense: blocks {gaps[:10]} missing")
    positions: set[int] = set()
    for b in sorted(blocks):
        positions.update(
            range(b * block_size, (b + 1) * block_size if end is None else min((b + 1) * block_size, end))
        )
    audit.positions_handed_out = len(positions)
    takeovers = [k for k in storage.list(TAKEOVER_DIR) if k.endswith(".json")]
    audit.blocks_adopted = len(takeovers)
    for key in takeovers:
        block = int(key.rsplit("/", 1)[-1].split("-")[0])
        if block not in blocks:
            audit.problems.append(f"takeover {key} of a block nobody claimed")

    # open at the end and recorded drops: every worker's state file
    open_positions: set[int] = set()
    for key in storage.list(keys.ROLLOUT_DIR):
        doc = _json(storage, key)
        if not key.rsplit("/", 1)[-1].startswith("state-") or not isinstance(doc, dict):
            continue
        audit.drops_recorded += int(doc.get("released", 0))
        for b, info in (doc.get("blocks") or {}).items():
            for p in info.get("open", []):
                if p // block_size != int(b) or p not in positions:
                    audit.problems.append(f"{key}: open position {p} is not in claimed block {b}")
                    continue
                open_positions.add(p)

    # committed: groups of verified shards. A record that names its groups' positions (the rollout loop's)
    # is matched by position; one that does not (older writers) by prompt, a prompt being one position
    # per epoch. By position is exact even when a slot ran another prompt than its own (the prompt review).
    committed = _committed_groups(storage, audit)
    audit.groups_committed = len(committed)
    ids = collections.Counter(g for g, _, _ in committed)
    audit.groups_committed_twice = sum(c - 1 for c in ids.values())
    at = collections.Counter(p for _, _, p in committed if p is not None)
    for p, c in at.items():
        if p not in positions:
            audit.groups_unclaimed += c
            continue
        audit.positions_committed += 1
        audit.positions_generated_twice += c - 1
    handed: dict[str, list[int]] = collections.defaultdict(list)  # prompt_id -> positions not committed
    for p in sorted(positions - set(at)):
        handed[prompt_of(p)].append(p)
    by_prompt = collections.Counter(pid for _, pid, p in committed if p is None)
    left = 0  # positions neither committed nor open: what the recorded drops must cover
    for pid in set(handed) | set(by_prompt):
        n_handed, n_committed = len(handed.get(pid, ())), by_prompt.get(pid, 0)
        if n_handed == 0:
            audit.groups_unclaimed += n_committed
            continue
        done = min(n_committed, n_handed)
        audit.positions_committed += done
        audit.positions_generated_twice += n_committed - done
        n_open = min(sum(p in open_positions for p in handed[pid]), n_handed - done)
        audit.positions_open_at_end += n_open
        left += n_handed - done - n_open
    audit.positions_dropped = min(left, audit.drops_recorded)
    audit.positions_unaccounted = left - audit.positions_dropped
    audit.drops_unmatched = audit.drops_recorded - audit.positions_dropped

    # trained: the consumed records of steps 1 .. the final version
    done_doc = _json(storage, keys.TRAINER_DONE_KEY)
    if isinstance(done_doc, dict) and isinstance(done_doc.get("version"), int):
        audit.final_version = done_doc["version"]
    else:
        audit.problems.append("trainer/DONE.json is missing: training did not finish")
    trained: collections.Counter[str] = collections.Counter()
    for step in range(1, audit.final_version + 1):
        doc = _json(storage, f"{CONSUMED_DIR}/step-{step:08d}.json")
        if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
            audit.problems.append(f"no consumed record for step {step}")
            continue
        trained.update(str(g) for g in doc["groups"])
    audit.groups_trained = sum(trained.values())
    audit.groups_trained_twice = sum(c - 1 for c in trained.values())
    audit.groups_trained_not_committed = sum(c for g, c in trained.items() if g not in ids)
    for key in storage.list(credits.CREDIT_DIR):
        with contextlib.suppress(ValueError):
            audit.groups_dropped_stale_by_trainer += len(credits.dropped_indices(_json(storage, key)))

    # the end: the final checkpoint committed and named by LATEST, the trial finalized
    v = audit.final_version
    latest, final = _json(storage, keys.LATEST_KEY), _json(storage, keys.FINALIZED_KEY)
    audit.final_committed = (
        v >= 0
        and isinstance(latest, dict) and latest.get("version") == v
        and storage.exists(keys.checkpoint_commit_key(v))
        and isinstance(final, dict) and final.get("final_version") == v
    )  # fmt: skip
    return audit


def audit_config(config: str, overrides: Sequence[str]) -> Audit:
    """``audit_trial`` of the trial a config (plus overrides) names."""
    from rollflow.configuration.loader import load_config
    from rollflow.data import load_prompts

    cfg = load_config(config, overrides)
    storage = open_trial_storage(cfg)
    rows = load_prompts(cfg.dataset, cfg.dataset.train_split, storage_options=cfg.storage.options or None)
    block = min(cfg.rollout.claim_block_size, cfg.train.batch_size)
    return audit_trial(storage, rows, seed=cfg.seed, block_size=block, max_epochs=cfg.rollout.max_epochs)
