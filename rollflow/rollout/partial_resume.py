"""Partial episodes across a graceful stop, from the rollout worker's side: continue them, keep them.

What it is: two steps of a worker with ``rollout.keep_partials``.

- ``continue_saved`` (at start): read the partial episodes an earlier graceful stop put in storage, drop
  those whose oldest token is already stale (``judge_saved`` against the acceptance bound), and wrap the
  worker's client in a ``PartialKeepingClient`` that continues the others;
- ``keep_cut`` (at a graceful stop, after ``PartialKeepingClient.astop`` cut what was in flight): put the
  episodes the executor cancelled, finished samples and cut ones, in one record for the next life.

What it is not: the client wrapper and the judging (``rollflow.rollout.partials``) or the record's
storage format (``storage.partial_records``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence

from rollflow.api.inference import InferenceClient
from rollflow.rollout.partials import PartialKeepingClient, from_records, judge_saved, to_records
from storage.fs import Storage
from storage.partial_records import load_partials, put_partials

logger = logging.getLogger(__name__)


async def continue_saved(storage: Storage, client: InferenceClient, *, bound: int) -> PartialKeepingClient:
    """``client`` wrapped to continue the saved partial episodes not stale against ``bound``."""
    records, _ = await asyncio.to_thread(load_partials, storage)
    saved, n_stale, stale_tokens = judge_saved(from_records(records), bound=bound)
    if records:
        logger.info(
            "partial episodes from a graceful stop: %d to continue (%d tokens), %d discarded as stale "
            "(%d tokens; oldest token before v%d): their prompts are generated afresh",
            len(saved),
            sum(len(x.output_ids) for v in saved.values() for x in v),
            n_stale,
            stale_tokens,
            bound,
        )
    return PartialKeepingClient(client, saved)


async def keep_cut(
    storage: Storage,
    keeper: PartialKeepingClient,
    *,
    writer_id: str,
    cancelled: Sequence[Hashable],
    block_size: int,
    drain_s: float,
) -> None:
    """Put the ``cancelled`` episodes' samples (one record per writer); log what was kept and how long."""
    t_put = time.monotonic()
    episodes = keeper.episodes(cancelled)
    records = to_records(episodes, block_size=block_size)
    if records:
        await asyncio.to_thread(put_partials, storage, writer_id, records)
    logger.info(
        "kept %d partial episode(s) (%d tokens) for the resume: partial_commit_s %.2f (drain %.2f, put %.2f)",
        len(records),
        sum(len(x.output_ids) for v in episodes.values() for x in v),
        drain_s + time.monotonic() - t_put,
        drain_s,
        time.monotonic() - t_put,
    )
