"""Packing groups into token-budget micro-batches (first-fit decreasing) and across ranks and minibatches.

What it is: pure functions on integer sizes (token counts of trajectory groups). A group is never split:
GRPO's advantages and the minibatch / rank partitions all work at group granularity.
What it is not: tensor code. ``batching.py`` turns the index lists returned here into padded tensors.

- ``ffd_pack(sizes, budget)``: bins of total size <= budget. Items sorted by size, largest first (ties by
  index), each goes into the first bin it fits, else a new bin. An item larger than the budget gets a bin
  of its own and a warning (it cannot be split).
- ``balanced_partition(sizes, n)``: n parts with near-equal totals (largest first, each item to the
  currently lightest part; ties by part index). Used for minibatches and for ranks ("FFD across ranks").
- ``plan_step``: the full schedule of one training step for one rank.

Example (hand-worked): sizes [5, 3, 8, 2, 4], budget 10 -> sorted 8(2), 5(0), 4(4), 3(1), 2(3):
8 -> bin A; 5 -> bin B; 4 -> B (9); 3 -> new bin C; 2 -> A (10). Bins: [[2, 3], [0, 4], [1]].
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)


def ffd_pack(sizes: Sequence[int], budget: int, *, warn: bool = True) -> list[list[int]]:
    """First-fit-decreasing bins of item indices (each bin sorted ascending; bins in creation order)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        size = sizes[i]
        if size > budget:
            if warn:
                logger.warning(
                    "a group of %d tokens exceeds max_tokens_per_mb=%d; it gets a micro-batch of its own "
                    "(groups are never split). Raise train.max_tokens_per_mb if this runs out of memory.",
                    size,
                    budget,
                )
            bins.append([i])
            loads.append(size)
            continue
        for b, load in enumerate(loads):
            if load + size <= budget:
                bins[b].append(i)
                loads[b] += size
                break
        else:
            bins.append([i])
            loads.append(size)
    return [sorted(b) for b in bins]


def balanced_partition(sizes: Sequence[int], n_parts: int) -> list[list[int]]:
    """``n_parts`` lists of item indices with near-equal size totals; parts may be empty if items < parts."""
    if n_parts < 1:
        raise ValueError(f"n_parts must be >= 1, got {n_parts}")
    parts: list[list[int]] = [[] for _ in range(n_parts)]
    heap = [(0, p) for p in range(n_parts)]  # (load, part index): the lightest part pops first
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, p = heapq.heappop(heap)
        parts[p].append(i)
        heapq.heappush(heap, (load + sizes[i], p))
    return [sorted(p) for p in parts]


@dataclass(frozen=True)
class MinibatchPlan:
    """One PPO minibatch as seen by one rank.

    groups: every group index of the minibatch (all ranks); micro_batches: this rank's micro-batches,
    each a list of group indices, padded with empty lists up to ``n_micro`` (the maximum over ranks), so
    every rank runs the same number of forward/backward passes (FSDP2 and DDP collectives must match).
    """

    groups: list[int]
    micro_batches: list[list[int]]

    @property
    def n_micro(self) -> int:
        return len(self.micro_batches)


def plan_step(
    group_tokens: Sequence[int],
    *,
    n_minibatches: int,
    world_size: int,
    rank: int,
    max_tokens_per_mb: int,
) -> list[MinibatchPlan]:
    """Minibatches (balanced by tokens) -> ranks (balanced by tokens) -> FFD micro-batches.

    Deterministic: every rank computes the same plan from the same ``group_tokens`` without talking.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    plans: list[MinibatchPlan] = []
    for mb_groups in balanced_partition(group_tokens, n_minibatches):
        per_rank = balanced_partition([group_tokens[g] for g in mb_groups], world_size)
        packed: list[list[list[int]]] = []  # [rank][micro-batch] -> group indices
        for r in range(world_size):
            rank_groups = [mb_groups[j] for j in per_rank[r]]
            bins = ffd_pack([group_tokens[g] for g in rank_groups], max_tokens_per_mb, warn=r == rank)
            packed.append([[rank_groups[i] for i in b] for b in bins])
        n_micro = max(1, max(len(p) for p in packed))
        mine = packed[rank] + [[] for _ in range(n_micro - len(packed[rank]))]
        plans.append(MinibatchPlan(groups=sorted(mb_groups), micro_batches=mine))
    return plans


def keep_groups(plans: Sequence[MinibatchPlan], keep: set[int], *, keep_empty: bool) -> list[MinibatchPlan]:
    """The same schedule with only the ``keep`` groups left in the micro-batches.

    ``plan.groups`` is unchanged: the loss of a minibatch is still normalised by the tokens of all its
    groups, so leaving out groups whose loss is identically zero (GRPO advantage 0 and no KL term)
    changes no gradient, only the work. ``keep_empty`` leaves emptied micro-batches in place (several
    ranks must run the same number of passes); otherwise they are dropped, and a minibatch with nothing
    left keeps one empty micro-batch: a zero-gradient dummy pass, so AdamW still takes the step it
    would have taken on the all-zero gradient.
    """
    out: list[MinibatchPlan] = []
    for plan in plans:
        mbs = [[g for g in mb if g in keep] for mb in plan.micro_batches]
        if not keep_empty:
            mbs = [mb for mb in mbs if mb] or [[]]
        out.append(MinibatchPlan(groups=plan.groups, micro_batches=mbs))
    return out
