"""The staleness rule, in one place: which groups may exist, start, be accepted and be trained.

The rule (AReaL's, in GROUPS: one episode is one prompt is one ``TrajectoryGroup``; ``B`` is the trainer's
groups per step, ``S`` = ``rollout.max_staleness``, ``v`` = the trainer version the servers have loaded):

    max_samples(v)            = (S + v + 1) * B          groups that may ever exist at version v
    capacity(v)               = min(max_concurrent - running,  max_samples(v) - (live + running))
    claim_fits(reserved, v)   = reserved - released - credited <= max_samples(v)
    expected_consumer(v)      = max(v, live // B)        the version an oldest-first trainer eats the next group at
    min_trainable_version(v)  = v - S                    the oldest head version a trainer at v still trains
    is_stale(head, m)         = 0 <= head < m            (head -1: no model token, never stale)

Who applies which: the executor starts an episode only while ``capacity(v) > 0`` (``try_submit``) and
rejects a finished group when ``is_stale(head, min_trainable_version(expected_consumer(v)))``
(``acceptance_bound``); the prompt source hands out a prompt only if ``claim_fits``; a graceful
stop's saved partial episodes are judged by the same acceptance bound; the trainer at version ``v``
drops groups with ``is_stale(head, min_trainable_version(v))``. Change the rule here and nowhere else:
these functions are its only arithmetic (``rollflow.rollout.staleness.StalenessManager`` keeps the
counters they are applied to).

Why the capacity bounds staleness: the trainer at version ``v`` has consumed ``v * B`` groups and
consumes oldest first, so a group that is among the first ``max_samples(v)`` ever produced is consumed
at a version ``<= v + S`` -- at most ``S`` versions after the weights it was started under. The
capacity alone does not stop a long episode started early from finishing after newer ones were
consumed, hence the acceptance check. Worked examples (tests/rollout/test_staleness_rule.py):

- capacity: v = 5, S = 2, B = 64, 500 groups accepted or running, 1000 max concurrent ->
  min(1000 - r, (2 + 5 + 1) * 64 - 500) = 512 - 500 = 12;
- claims: B = 4, S = 1, v = 0, K = 2, nothing released: blocks 0..3 fit (4 * 2 = 8 <= (1 + 0 + 1) * 4 = 8),
  block 4 (prompts 8 and 9) waits for version 1 (10 <= 12);
- acceptance: S = 1, B = 16, 70 live groups, v = 2 -> expected_consumer = max(2, 70 // 16) = 4, bound
  4 - 1 = 3: a group whose oldest token is v2 is stale, one from v3 is kept;
- trainer: v = 7, S = 2 -> groups with head_version < 5 are dropped.

Why it lives in ``rollflow/api/``: it is the contract between the rollout, the agent workflow's
per-episode bound and the trainer, which sit on different floors; like ``net.py``'s loopback rule it is
pure arithmetic that imports nothing.
What it is not: counters, threads or storage (``rollflow.rollout.staleness``).
"""

from __future__ import annotations


def max_samples(version: int, *, max_staleness: int, batch_size: int) -> int:
    """``(max_staleness + version + 1) * batch_size``: groups that may ever exist at ``version``."""
    return (max_staleness + version + 1) * batch_size


def staleness_room(max_samples: int, *, live: int, running: int) -> int:
    """``max_samples - (live + running)``: episodes the staleness bound alone lets start (<= 0: none)."""
    return max_samples - (live + running)


def capacity(max_concurrent: int, *, running: int, room: int) -> int:
    """``min(max_concurrent - running, room)``: episodes that may start now (may be <= 0)."""
    return min(max_concurrent - running, room)


def claim_fits(reserved: int, *, released: int, credited: int, max_samples: int) -> bool:
    """``reserved - released - credited <= max_samples``: may prompts up to global position ``reserved``
    be claimed."""
    return reserved - released - credited <= max_samples


def expected_consumer(version: int, *, live: int, batch_size: int) -> int:
    """``max(version, live // batch_size)``: the version an oldest-first trainer eats the next group at
    (``live`` trainable groups are ahead of it; it reaches group index k at version k // B or later)."""
    return max(version, live // batch_size)


def min_trainable_version(version: int, *, max_staleness: int) -> int:
    """``version - max_staleness``: the oldest head version a trainer at ``version`` still trains."""
    return version - max_staleness


def is_stale(head_version: int, min_version: int) -> bool:
    """``0 <= head_version < min_version`` (a head of -1, no model token, is never stale)."""
    return 0 <= head_version < min_version
