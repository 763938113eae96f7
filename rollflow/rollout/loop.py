"""The rollout loop: dataset -> WorkflowExecutor -> ShardWriter, until the trainer is done.

What it is: ``run_rollout_loop(cfg, storage, client, ...)``, one coroutine that
1. loads the train split and checks every row where it enters (``dataset.on_bad_row``: raise a
   ``DatasetRowError`` naming the row and field, or skip and count);
2. restores its accounting from storage (``GroupLedger``): every writer's committed groups and the
   credited ones (dropped stale or quarantined by the trainer), never 0 after a restart (AReaL #1388),
   and adopts the prompt blocks its earlier life left unfinished (``rollout/state-{name}.json``);
3. runs episodes through the executor under the staleness capacity, on prompts it claims block by
   block in storage (``ClaimedPrompts``: each prompt goes to exactly one worker per epoch, and a block
   is claimed only if the trial's global bound allows it), writing accepted groups as shards;
4. after every shard commit, every claim and every ``done_poll_s`` it persists its state (held blocks
   and their open prompts, counters, ``released`` = rejected + failed + evicted): the heartbeat other
   workers read. On the same tick it re-reads the ledger and the other workers' state files: their
   releases enter the bound, and the blocks of a worker silent for ``rollout.worker_lease_s`` are
   adopted (one exclusive put per block decides who runs them);
5. stops on the trainer's done marker (``trainer/DONE.json``), ``stop_event``, ``rollout.max_groups``,
   or after ``rollout.max_epochs`` passes, and returns a ``RolloutSummary``.

``writer_name`` is the worker's stable id: its state file is ``rollout/state-{writer_name}.json`` and a
restart with the same name continues its blocks; two live workers must never share one (the Prefect task
derives it from the flow run). Shard keys carry an extra random suffix per process, so a restarted
worker never reuses a key and counts only its own commits.

The data order: epoch e visits the rows in a permutation seeded by ``(cfg.seed, e)``; a prompt's key is
its global position ``e * N + position``. An episode whose group committed just before a crash, in the
window before the state put, may run twice (at most one shard's worth); a block claimed just before a
crash, before the state put, is never run (its prompts are skipped for that epoch).

What it is not: the checkpoint watcher or the servers (the caller starts them and passes ``version_fn``,
usually ``client.get_version``); the Prefect task (``tasks/rollout.py``) is a thin adapter over this.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import DatasetRowError, RewardFunctionError
from rollflow.api.inference import InferenceClient
from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.api.workflow import RolloutWorkflow
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.filters import build_should_accept
from rollflow.rollout.partials import PartialKeepingClient, from_records, judge_saved, to_records
from rollflow.rollout.prompt_filter import ZeroVarianceSkip
from rollflow.rollout.prompt_source import ClaimedPrompts
from rollflow.rollout.staleness import StalenessListener, StalenessManager
from rollflow.rollout.supply import bounded_supply_warning
from rollflow.timing.clock import Timeline
from rollflow.workflows.factory import build_workflow
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.group_ledger import GroupLedger, LedgerView
from storage.partial_records import load_partials, put_partials
from storage.prompt_claims import ClaimLog, takeover_key
from storage.shard_writer import ShardWriter

logger = logging.getLogger(__name__)

STATE_FORMAT = 2  # format 1 (one writer, no claims) is read as "nothing to adopt"
REWARD_BROKEN_AFTER = 64  # reward calls that all raised before the loop calls the reward function broken
StopReason = Literal["done", "stop_event", "limit", "epochs"]


@dataclass
class RolloutSummary:
    """What one run of the loop did (``total_accepted``: committed by every run of this worker name)."""

    stopped_by: StopReason
    accepted: int
    rejected: int
    failed: int
    total_accepted: int
    epoch: int
    position: int
    tokens: int
    tokens_per_s: float
    elapsed_s: float
    shards: int
    bad_rows: int
    writer: str

    def brief(self) -> str:
        """One line for a log."""
        return (
            f"{self.accepted} groups accepted ({self.rejected} rejected, {self.failed} failed), "
            f"{self.tokens} tokens at {self.tokens_per_s:.0f} tok/s in {self.elapsed_s:.1f} s, "
            f"{self.shards} shards; stopped by {self.stopped_by}"
        )


# --- data ---------------------------------------------------------------------------------------------


def check_row(row: Any) -> str | None:
    """None if ``row`` is a usable prompt row, else ``"field 'x': why"``."""
    if not isinstance(row, dict):
        return f"row is a {type(row).__name__}, not a mapping"
    if not isinstance(row.get("prompt_id"), (str, int)) or isinstance(row.get("prompt_id"), bool):
        return "field 'prompt_id': missing or not a string/int"
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "field 'messages': missing or not a non-empty list"
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return f"field 'messages[{j}]': needs string 'role' and 'content'"
    if "answer" not in row or row["answer"] is None:
        return "field 'answer': missing"
    return None


def checked_rows(
    rows: Sequence[Any], *, split: str, on_bad_row: Literal["error", "skip"]
) -> tuple[list[dict], int]:
    """Rows that pass ``check_row``, and how many were skipped; raise on the first bad one in error mode."""
    good: list[dict] = []
    bad = 0
    for i, row in enumerate(rows):
        problem = check_row(row)
        if problem is None:
            good.append(row)
            continue
        if on_bad_row == "error":
            raise DatasetRowError(
                f"{split} row {i}: {problem} (fix the data, or set dataset.on_bad_row=skip to skip such rows)"
            )
        bad += 1
        logger.warning("skipping %s row %d: %s", split, i, problem)
    if not good:
        raise DatasetRowError(f"{split} split has no usable rows ({bad} malformed)")
    return good, bad


def rollout_worker_id(run_id: str | None = None) -> str:
    """A worker id for ``writer_name``: ``rollout-{run id}`` (stable across retries of one flow run), else
    ``$ROLLFLOW_WORKER_ID``, else ``rollout-{host}-{pid}`` (unique on a host, but new after a restart)."""
    if run_id:
        return keys.check_name(f"rollout-{run_id.replace('-', '')[:16]}", "worker id")
    env = os.environ.get("ROLLFLOW_WORKER_ID")
    if env:
        return keys.check_name(env, "ROLLFLOW_WORKER_ID")
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "host"
    return f"rollout-{host}-{os.getpid()}"


# --- the loop -----------------------------------------------------------------------------------------


async def run_rollout_loop(
    cfg: ExperimentConfig,
    storage: Storage,
    client: InferenceClient,
    *,
    version_fn: Callable[[], int] | None = None,
    stop_event: threading.Event | None = None,
    metrics: MetricsSink | None = None,
    writer_name: str = "rollout",
    workflow: RolloutWorkflow | None = None,
    prompts: Sequence[Any] | None = None,
    listeners: Sequence[StalenessListener] = (),
    poll_interval_s: float = 0.2,
    done_poll_s: float = 2.0,
    metrics_interval_s: float = 5.0,
    timeline: Timeline | None = None,
) -> RolloutSummary:
    """Run until done/stop/limit/epochs (see the module docstring). ``workflow``/``prompts`` override
    the ones built from ``cfg`` (tests, notebooks); ``listeners`` see every StalenessManager event.
    ``timeline`` gets the ``rollout`` role's states, classified on every tick (``rollout_state``).
    Raises ``RolloutFailureError`` or ``DatasetRowError``.
    """
    t0 = time.monotonic()
    clock = (timeline or Timeline()).role("rollout", initial="idle")
    weights = timeline.roles().get("weights") if timeline is not None else None
    metrics = metrics or NullSink()
    version_fn = version_fn or client.get_version
    split = cfg.dataset.train_split
    if prompts is None:
        from rollflow.data import load_prompts

        options = cfg.storage.options or None  # s3:// dataset files on the same store
        prompts = await asyncio.to_thread(lambda: load_prompts(cfg.dataset, split, storage_options=options))
    rows, bad_rows = checked_rows(prompts, split=split, on_bad_row=cfg.dataset.on_bad_row)
    bounded_supply_warning(cfg, len(rows))  # a bounded dataset too small for the trainer: say so now

    state_key = keys.rollout_state_key(writer_name)
    state = await asyncio.to_thread(_load_state, storage, state_key)
    ledger = GroupLedger(storage)
    view = await asyncio.to_thread(ledger.refresh)
    committed = view.accepted
    staleness = StalenessManager(
        cfg.rollout.max_concurrent_rollouts,
        cfg.rollout.max_staleness,
        cfg.train.batch_size,
        listeners=listeners,
    )
    staleness.restore(accepted=committed, credited=view.credited, rejected=int(state.get("rejected", 0)))

    keeper: PartialKeepingClient | None = None
    drain_s = 0.0
    if cfg.rollout.keep_partials:  # continue what a graceful stop of an earlier life kept
        records, _ = await asyncio.to_thread(load_partials, storage)
        bound = staleness.expected_consumer_version(int(version_fn())) - cfg.rollout.max_staleness
        saved, n_stale, stale_tokens = judge_saved(from_records(records), bound=bound)
        keeper = PartialKeepingClient(client, saved)
        client = keeper
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
    owns_workflow = workflow is None
    if workflow is None:
        workflow = await asyncio.to_thread(build_workflow, cfg)
    writer = ShardWriter(
        storage,
        writer_name,
        flush_rows=cfg.rollout.shard_flush_rows,
        flush_seconds=cfg.rollout.shard_flush_seconds,
        on_evict=staleness.on_evicted,
    )
    failed_before = int(state.get("failed", 0))
    released_before = int(state.get("released", 0))
    shared = {"others_released": 0, "credited": view.credited}  # storage's view, refreshed by sync()
    claims = ClaimLog(storage)
    executor: WorkflowExecutor | None = None

    def own_released() -> int:
        st = executor.stats if executor is not None else None
        done_here = 0 if st is None else st.n_rejected + st.failed
        return released_before + done_here + writer.stats["evicted"]

    def fits(reserved: int) -> bool:
        released = shared["others_released"] + own_released()
        return reserved - released - shared["credited"] <= staleness.max_samples(int(version_fn()))

    def state_doc(ex: WorkflowExecutor) -> dict[str, Any]:
        s = staleness.stat
        nxt = 0 if source.last is None else source.last + 1
        return {
            "format": STATE_FORMAT,
            "writer": writer_name,
            "incarnation": writer.writer_id,
            "epoch": nxt // len(rows),
            "position": nxt % len(rows),
            "blocks": source.held_state(set(ex.open_keys())),
            "accepted": s.accepted,
            "rejected": s.rejected - ex.stats.failed - ex.stats.cancelled,
            "failed": failed_before + ex.stats.failed,
            "released": own_released(),
            "updated_at": time.time(),
        }

    def on_claim() -> None:  # loop thread, inside the executor's next(): record the block before use
        assert executor is not None
        storage.put_json(state_key, state_doc(executor))

    source = ClaimedPrompts(
        rows,
        seed=cfg.seed,
        max_epochs=cfg.rollout.max_epochs,
        claims=claims,
        block_size=min(cfg.rollout.claim_block_size, cfg.train.batch_size),
        worker=writer.writer_id,
        name=writer_name,
        fits=fits,
        on_claim=on_claim,
    )
    tried: set[tuple[int, int]] = set()
    own_life = re.compile(rf"^{re.escape(writer_name)}-[0-9a-f]{{8}}$")  # writer ids of this worker's lives

    def adopt_blocks(blocks: dict[str, Any], own: bool = False) -> None:
        for b, info in blocks.items():
            block, gen = int(b), int(info["gen"]) + 1
            while (block, gen) not in tried:
                tried.add((block, gen))
                if claims.try_take_over(block, gen, writer.writer_id):
                    source.adopt(block, gen, [int(p) for p in info["open"]])
                    break
                # An earlier life of this worker took the block over and was killed before its state file
                # said so: the block is still this worker's, so take the next generation (else its open
                # prompts would never run). Another worker's takeover (a lease expiry) wins.
                if not (own and own_life.match(_taken_over_by(storage, block, gen))):
                    break
                gen += 1

    await asyncio.to_thread(adopt_blocks, state.get("blocks", {}), True)  # this worker's earlier life
    logger.log(  # a line worth reading on a resume (what was restored and adopted), chatter otherwise
        logging.INFO if committed or source.adopted else logging.DEBUG,
        "rollout %s (%s) starts: %d rows (%d bad), %d groups committed (%d credited), next block %d, "
        "%d block(s) adopted",
        writer_name,
        writer.writer_id,
        len(rows),
        bad_rows,
        committed,
        view.credited,
        claims.next_block(),
        source.adopted,
    )

    def sync() -> None:  # worker thread: storage's view, other workers' releases, dead workers' blocks
        v = ledger.refresh()
        staleness.sync(
            accepted=v.accepted, credited=v.credited, own_visible=v.writer_groups(writer.writer_id)
        )
        others = 0
        now = time.time()
        for key in storage.list(keys.ROLLOUT_DIR):
            name = key.rsplit("/", 1)[-1]
            if key == state_key or not (name.startswith("state-") and name.endswith(".json")):
                continue
            try:
                doc = storage.get_json(key)
            except (FileNotFoundError, ValueError):
                continue
            if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
                continue
            others += int(doc.get("released", 0))
            if now - float(doc.get("updated_at", now)) > cfg.rollout.worker_lease_s:
                adopt_blocks(doc.get("blocks", {}))
        shared["others_released"], shared["credited"] = others, v.credited

    def on_flush(ex: WorkflowExecutor) -> None:  # loop thread, right after a commit
        ex.submit_io(storage.put_json, state_key, state_doc(ex))

    executor = WorkflowExecutor(
        workflow,
        client,
        staleness,
        writer=writer,
        version_fn=version_fn,
        should_accept_fn=build_should_accept(
            cfg.rollout.dynamic_sampling, cfg.rollout.should_accept_fn, cfg.rollout.dynamic_sampling_max_extra
        ),
        max_failure_rate=cfg.rollout.max_failure_rate,
        on_flush=on_flush,
        prompt_filter=(
            ZeroVarianceSkip(cfg.rollout.zero_variance_skip_prob, seed=cfg.seed)
            if cfg.rollout.zero_variance_skip_prob > 0
            else None
        ),
    )
    await asyncio.to_thread(sync)
    done_store = CheckpointStore(storage)
    stopped_by: StopReason | None = None
    try:
        async with executor:
            executor.feed(source)
            last_metrics = time.monotonic()
            last_done = last_metrics - done_poll_s  # look for the done marker on the first tick
            while stopped_by is None:
                await asyncio.sleep(poll_interval_s)
                executor.raise_if_failed()
                loading = weights is not None and weights.state == "loading"
                room = staleness.staleness_room(int(version_fn()))
                clock.enter(rollout_state(executor.n_running, room, loading=loading))
                now = time.monotonic()
                if stop_event is not None and stop_event.is_set():
                    stopped_by = "stop_event"
                elif (
                    cfg.rollout.max_groups is not None and staleness.accepted_total >= cfg.rollout.max_groups
                ):
                    stopped_by = "limit"
                elif executor.n_running == 0 and await asyncio.to_thread(lambda: source.exhausted):
                    stopped_by = "epochs"
                elif now - last_done >= done_poll_s:
                    last_done = now
                    if await asyncio.to_thread(done_store.is_done) is not None:
                        stopped_by = "done"
                    else:
                        await asyncio.to_thread(sync)
                        doc = state_doc(executor)  # the heartbeat other workers read
                        await asyncio.to_thread(storage.put_json, state_key, doc)
                if now - last_metrics >= metrics_interval_s:
                    last_metrics = now
                    _log_metrics(metrics, executor, staleness, workflow, version_fn())
                check_reward_fn(getattr(workflow, "reward_counts", None))
            if keeper is not None and stopped_by == "stop_event":  # a graceful stop: cut and keep
                executor.pause()
                drain_s = await keeper.astop(cfg.rollout.partial_drain_s)
        executor.raise_if_failed()
        if keeper is not None and stopped_by == "stop_event":
            t_put = time.monotonic()
            episodes = keeper.episodes(executor.cancelled_keys())
            records = to_records(episodes, block_size=source.k)
            if records:
                await asyncio.to_thread(put_partials, storage, writer.writer_id, records)
            logger.info(
                "kept %d partial episode(s) (%d tokens) for the resume: partial_commit_s %.2f "
                "(drain %.2f, put %.2f)",
                len(records),
                sum(len(x.output_ids) for v in episodes.values() for x in v),
                drain_s + time.monotonic() - t_put,
                drain_s,
                time.monotonic() - t_put,
            )
    finally:
        clock.enter("idle")
        await asyncio.to_thread(writer.close)
        await asyncio.to_thread(storage.put_json, state_key, state_doc(executor))
        if owns_workflow:
            close = getattr(workflow, "close", None)
            if close is not None:
                close()
    _log_metrics(metrics, executor, staleness, workflow, version_fn())
    final = await asyncio.to_thread(ledger.refresh)
    st = executor.stats
    elapsed = time.monotonic() - t0
    summary = RolloutSummary(
        stopped_by=stopped_by or "stop_event",
        accepted=st.accepted,
        rejected=st.n_rejected,
        failed=st.failed,
        total_accepted=_own_groups(final, writer_name),
        epoch=state_doc(executor)["epoch"],
        position=state_doc(executor)["position"],
        tokens=st.tokens,
        tokens_per_s=st.tokens / max(elapsed, 1e-9),
        elapsed_s=elapsed,
        shards=writer.stats["shards"],
        bad_rows=bad_rows,
        writer=writer.writer_id,
    )
    logger.debug("rollout %s stopped (%s): %s", writer_name, summary.stopped_by, summary)
    return summary


def check_reward_fn(counts: Any, *, after: int = REWARD_BROKEN_AFTER) -> None:
    """``RewardFunctionError`` once the reward function raised on every one of at least ``after`` calls:
    it is broken, and training on its zeros (or resuming the run) would not help."""
    if counts is None or counts.scored < after or counts.errors < counts.scored:
        return
    raise RewardFunctionError(
        f"the reward function raised on all {counts.errors} of its calls so far; the "
        "rollout log quotes its errors (trajectory rows also carry them as extra.reward_error). Fix "
        "dataset.reward_fn and run again"
    )


def rollout_state(n_running: int, staleness_room: int, *, loading: bool) -> str:
    """The rollout's state on one tick (``rollflow.timing.clock``; a sample every ``poll_interval_s``, so
    its shares are estimates at that resolution): ``paused`` while a weight load has the servers paused;
    else ``generating`` with episodes in flight; else ``capacity_wait`` when nothing runs because the
    staleness bound holds new episodes back; else ``idle`` (nothing to run: start-up, data exhausted)."""
    if loading:
        return "paused"
    if n_running > 0:
        return "generating"
    return "capacity_wait" if staleness_room <= 0 else "idle"


def _own_groups(view: LedgerView, name: str) -> int:
    """Committed groups of every incarnation of worker ``name`` (writer ids ``{name}-{8 hex}``)."""
    own = re.compile(rf"^{re.escape(name)}-[0-9a-f]{{8}}$")
    return sum(n for w, n in view.by_writer.items() if own.match(w))


def _taken_over_by(storage: Storage, block: int, gen: int) -> str:
    """The writer id that took over ``block`` for generation ``gen`` ("" if unreadable)."""
    try:
        doc = storage.get_json(takeover_key(block, gen))
    except (FileNotFoundError, ValueError):
        return ""
    return str(doc.get("by", "")) if isinstance(doc, dict) else ""


def _load_state(storage: Storage, key: str) -> dict[str, Any]:
    try:
        doc = storage.get_json(key)
    except FileNotFoundError:
        return {}
    if isinstance(doc, dict) and doc.get("format") == 1:
        return {k: doc[k] for k in ("rejected", "failed") if k in doc}
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise ValueError(f"rollout state {key} has an unknown format; delete it to start the data over")
    return doc


def _log_metrics(
    sink: MetricsSink, ex: WorkflowExecutor, staleness: StalenessManager, workflow: Any, version: int
) -> None:
    out = ex.stats.as_metrics()
    s = staleness.stat
    out.update(
        {
            "running": float(s.running),
            "groups_total": float(s.accepted),
            "capacity": float(max(0, staleness.get_capacity(version))),
            "version": float(version),
        }
    )
    counts = getattr(workflow, "reward_counts", None)
    if counts is not None:
        out.update(counts.as_metrics())
    sink.log(out, step=version)
