"""The rollout worker: dataset -> WorkflowExecutor -> ShardWriter, until the trainer is done.

What it is: ``RolloutWorker(cfg, storage, client, ...).run()`` (``run_rollout_loop`` builds one and runs
it). The story of one worker:

1. load the train split and check every row where it enters (``prompt_rows``);
2. restore its accounting from storage (``GroupLedger``): every writer's committed groups and the
   credited ones (dropped stale or quarantined by the trainer), never 0 after a restart (AReaL #1388),
   and adopt the prompt blocks its earlier life left unfinished (its ``WorkerState``,
   ``storage.worker_state``);
3. claim prompts block by block (``ClaimedPrompts``: each prompt goes to exactly one worker per epoch,
   and a block is claimed only if the staleness rule's claim gate allows it), run episodes through the
   executor under the staleness capacity, and commit accepted groups as shards;
4. after every commit, every claim and every ``done_poll_s``, put its state (held blocks and their open
   prompts, counters, ``released`` = rejected + failed + evicted): the heartbeat other workers read. On
   the same tick it re-reads the ledger and the other workers' states: their releases enter the bound,
   and the blocks of a worker silent for ``rollout.worker_lease_s`` are adopted (one exclusive put per
   block decides who runs them);
5. stop on the trainer's done marker (``trainer/DONE.json``), ``stop_event``, ``rollout.max_groups``, or
   after ``rollout.max_epochs`` passes, and return a ``RolloutSummary``. A graceful stop with
   ``rollout.keep_partials`` keeps the episodes in flight for the next life (``partials``).

``writer_name`` is the worker's stable id: its state file is ``rollout/state-{writer_name}.json`` and a
restart with the same name continues its blocks; two live workers must never share one (the Prefect task
derives it from the flow run). Shard keys carry an extra random suffix per process, so a restarted
worker never reuses a key and counts only its own commits.

A prompt's key is its global position ``epoch * N + position`` (``prompt_source``). On a resume the
storage records decide, not the state file alone: a group committed just before a crash, before the state
put, is known by its commit record's positions and not run again; a block claimed just before a crash,
before the state put, is found in the claim log from the state's ``claim_mark`` on and run
(``prompt_source``, "Resume from storage"). A state is put once at start, so a first claim has a mark.

What it is not: the staleness arithmetic (``rollflow.api.staleness``), the storage layout of its
state (``storage.worker_state``), the checkpoint watcher or the servers (the caller starts them and
passes ``version_fn``, usually ``client.get_version``); the Prefect task (``tasks/rollout.py``) is a thin
adapter over this.
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
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.inference import InferenceClient
from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.api.workflow import RolloutWorkflow
from rollflow.clock.roles import RoleClock, Timeline
from rollflow.rollout.executor import WorkflowExecutor
from rollflow.rollout.filters import build_should_accept
from rollflow.rollout.partial_resume import continue_saved, keep_cut
from rollflow.rollout.partials import PartialKeepingClient
from rollflow.rollout.prompt_filter import PromptCurriculum, build_curriculum
from rollflow.rollout.prompt_review import PromptReview, build_review
from rollflow.rollout.prompt_rows import load_rows
from rollflow.rollout.prompt_source import ClaimedPrompts
from rollflow.rollout.staleness import StalenessListener, StalenessManager
from rollflow.rollout.worker_report import (
    RolloutSummary,
    StopReason,
    check_reward_fn,
    rollout_metrics,
    rollout_state,
)
from rollflow.workflows.factory import build_workflow
from storage import keys
from storage.checkpoints import CheckpointStore
from storage.fs import Storage
from storage.group_ledger import GroupLedger, LedgerView
from storage.prompt_claims import ClaimLog
from storage.shard_writer import ShardWriter
from storage.worker_state import WorkerState, WorkerStateStore, is_incarnation_of

logger = logging.getLogger(__name__)


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


async def run_rollout_loop(
    cfg: ExperimentConfig, storage: Storage, client: InferenceClient, **options: Any
) -> RolloutSummary:
    """``RolloutWorker(cfg, storage, client, **options).run()``: run until done/stop/limit/epochs (see the
    module docstring); ``options`` are ``RolloutWorker``'s keyword arguments (an unknown one is a
    ``TypeError`` naming it)."""
    return await RolloutWorker(cfg, storage, client, **options).run()


class RolloutWorker:
    """One rollout worker; see the module docstring. Storage calls run off the event loop."""

    def __init__(
        self,
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
    ) -> None:
        """``workflow``/``prompts`` override the ones built from ``cfg`` (tests, notebooks);
        ``listeners`` see every StalenessManager event; ``timeline`` gets the ``rollout`` role's states,
        classified on every tick (``rollout_state``)."""
        self.cfg, self.storage, self.name = cfg, storage, writer_name
        self.client = client
        self.version_fn = version_fn or client.get_version
        self.stop_event, self.metrics = stop_event, metrics or NullSink()
        self.workflow, self.owns_workflow = workflow, workflow is None
        self.prompts, self.listeners = prompts, listeners
        self.poll_interval_s, self.done_poll_s = poll_interval_s, done_poll_s
        self.metrics_interval_s = metrics_interval_s
        self.timeline = timeline
        self.states = WorkerStateStore(storage, writer_name)
        self.ledger = GroupLedger(storage)
        self.claims = ClaimLog(storage)
        self.keeper: PartialKeepingClient | None = None  # with rollout.keep_partials
        self.curriculum: PromptCurriculum | None = build_curriculum(cfg.rollout, seed=cfg.seed)
        self.review: PromptReview | None = build_review(cfg.rollout)
        self._tried: set[tuple[int, int]] = set()  # (block, generation) takeovers tried
        self._others_released = 0  # storage's view, refreshed by _sync
        self._credited = 0
        self._claim_blocked = False  # the last claim gate decision (rollout_state's claim_wait)
        self._exhausted = False  # the source's last answer (rollout_state's exhausted)
        rc = cfg.rollout
        self.clock: RoleClock = (timeline or Timeline()).role("rollout", initial="idle")  # this role's states
        self.staleness = StalenessManager(  # restored from storage by run() before the first episode
            rc.max_concurrent_rollouts, rc.max_staleness, cfg.train.batch_size, listeners=listeners
        )
        self.writer = ShardWriter(
            storage,
            writer_name,
            flush_rows=rc.flush_rows(cfg.train.batch_size),
            flush_seconds=rc.shard_flush_seconds,
            on_evict=self.staleness.on_evicted,
            # no trained token newer than the newest published policy (ShardWriter's version rule)
            version_ceiling=CheckpointStore(storage).latest_version,
        )
        self.done_store = CheckpointStore(storage)  # where the trainer's done marker is read
        # Filled by run(), in this order: the rows, the accounting, the prompt source, the executor.
        self.weights: RoleClock | None = None  # the checkpoint watcher's role, if the timeline has one
        self.rows: list[dict] = []
        self.bad_rows = 0
        self.before = WorkerState()  # what this worker's earlier life left (empty on a fresh start)
        self.view = LedgerView(accepted=0, credited=0)  # storage's committed and credited groups
        self.source: ClaimedPrompts | None = None  # needs the rows
        self.executor: WorkflowExecutor | None = None  # needs the workflow, the writer and the source

    # --- the story ------------------------------------------------------------------------------------------

    async def run(self) -> RolloutSummary:
        """Claim prompts, run episodes, commit, heartbeat; until a stop reason. Raises
        ``RolloutFailureError`` or ``DatasetRowError``."""
        t0 = time.monotonic()
        self.weights = self.timeline.roles().get("weights") if self.timeline is not None else None
        self.rows, self.bad_rows = await load_rows(self.cfg, self.prompts)
        await self._restore_accounting()
        await self._continue_partials()
        await self._open_prompts()
        self.executor = self._build_executor()
        await asyncio.to_thread(self._sync)
        await asyncio.to_thread(lambda: self.states.put(self._state()))  # a claim_mark before the first claim
        stopped_by: StopReason | None = None
        try:
            async with self.executor:
                self.executor.feed(self.source)
                stopped_by = await self._until_stopped()
                drain_s = await self._cut_partials() if self._keeps_partials(stopped_by) else 0.0
            self.executor.raise_if_failed()
            if self._keeps_partials(stopped_by):
                await self._keep_partials(drain_s)
        finally:
            await self._close()
        return await self._summary(stopped_by or "stop_event", t0)

    async def _until_stopped(self) -> StopReason:
        """One tick every ``poll_interval_s``; the done marker, sync and heartbeat every ``done_poll_s``."""
        stopped_by: StopReason | None = None
        last_metrics = time.monotonic()
        last_done = last_metrics - self.done_poll_s  # look for the done marker on the first tick
        while stopped_by is None:
            await asyncio.sleep(self.poll_interval_s)
            self.executor.raise_if_failed()
            loading = self.weights is not None and self.weights.state == "loading"
            room = self.staleness.staleness_room(int(self.version_fn()))
            self.clock.enter(
                rollout_state(
                    self.executor.n_running,
                    room,
                    loading=loading,
                    buffered=self.executor.buffered,
                    claim_blocked=self._claim_blocked,
                    exhausted=self._exhausted,
                )
            )
            now = time.monotonic()
            stopped_by = await self._local_stop_reason()
            if stopped_by is None and now - last_done >= self.done_poll_s:
                last_done = now
                stopped_by = await self._heartbeat()
            if now - last_metrics >= self.metrics_interval_s:
                last_metrics = now
                self._log_metrics()
            check_reward_fn(self.workflow.metrics())
        return stopped_by

    async def _local_stop_reason(self) -> StopReason | None:
        limit = self.cfg.rollout.max_groups
        if self.stop_event is not None and self.stop_event.is_set():
            # the embedded flow sets the event when training ends too: that is the trial's end, and
            # nothing in flight is kept for a resume that will not come
            done = await asyncio.to_thread(self.done_store.is_done)
            return "done" if done is not None else "stop_event"
        if limit is not None and self.staleness.accepted_total >= limit:
            return "limit"
        if self.executor.n_running == 0:
            self._exhausted = await asyncio.to_thread(lambda: self.source.exhausted)
            if self._exhausted:
                return "epochs"
        return None

    async def _heartbeat(self) -> StopReason | None:
        """ "done" once the trainer wrote its marker; else sync with storage and put this worker's state."""
        if await asyncio.to_thread(self.done_store.is_done) is not None:
            return "done"
        await asyncio.to_thread(self._sync)
        state = self._state()  # the heartbeat other workers read
        await asyncio.to_thread(self.states.put, state)
        return None

    # --- start: rows, accounting, partial episodes, writer and prompts ----------------------------------------

    async def _restore_accounting(self) -> None:
        self.before = await asyncio.to_thread(self.states.load) or WorkerState()
        self.view = await asyncio.to_thread(self.ledger.refresh)
        self.staleness.restore(
            accepted=self.view.accepted, credited=self.view.credited, rejected=self.before.rejected
        )
        self._credited = self.view.credited

    async def _continue_partials(self) -> None:
        """Continue what a graceful stop of an earlier life kept (``rollout.keep_partials``)."""
        if self.cfg.rollout.keep_partials:
            bound = self.staleness.acceptance_bound(int(self.version_fn()))
            self.keeper = await continue_saved(self.storage, self.client, bound=bound)
            self.client = self.keeper

    async def _open_prompts(self) -> None:
        cfg = self.cfg
        if self.workflow is None:
            self.workflow = await asyncio.to_thread(build_workflow, cfg)
        self.source = ClaimedPrompts(
            self.rows,
            seed=cfg.seed,
            max_epochs=cfg.rollout.max_epochs,
            claims=self.claims,
            block_size=min(cfg.rollout.claim_block_size, cfg.train.batch_size),
            worker=self.writer.writer_id,
            name=self.name,
            fits=self._claim_fits,
            on_claim=lambda: self.states.put(self._state()),  # record the block before any prompt runs
            skips_ahead=None if self.curriculum is None else self.curriculum.decide_ahead,
        )
        await asyncio.to_thread(  # this worker's earlier life: its state file's blocks and unrecorded claims
            lambda: self._adopt(
                {**self.source.unrecorded(self.name, self.before.claim_mark), **self.before.blocks}, True
            )
        )
        logger.log(  # a line worth reading on a resume (what was restored and adopted), chatter otherwise
            logging.INFO if self.view.accepted or self.source.adopted else logging.DEBUG,
            "rollout %s (%s) starts: %d rows (%d bad), %d groups committed (%d credited), next block %d, "
            "%d block(s) adopted",
            self.name,
            self.writer.writer_id,
            len(self.rows),
            self.bad_rows,
            self.view.accepted,
            self.view.credited,
            self.claims.next_block(),
            self.source.adopted,
        )

    def _build_executor(self) -> WorkflowExecutor:
        rc = self.cfg.rollout
        assert self.workflow is not None
        return WorkflowExecutor(
            self.workflow,
            self.client,
            self.staleness,
            writer=self.writer,
            version_fn=self.version_fn,
            should_accept_fn=build_should_accept(
                rc.dynamic_sampling, rc.should_accept_fn, rc.dynamic_sampling_max_extra
            ),
            max_failure_rate=rc.max_failure_rate,
            on_flush=lambda ex: ex.submit_io(self.states.put, self._state()),  # right after a commit
            prompt_filter=self.curriculum,
            review=self.review,
            on_episode_end=None if self.keeper is None else self.keeper.forget,  # its record of the episode
        )

    # --- the shared bound: claims, peers, adoption ----------------------------------------------------------

    def _own_released(self) -> int:
        """Released groups of every life of this worker: rejected + failed + evicted."""
        ex = self.executor  # None while the source adopts and claims its first blocks
        done_here = 0 if ex is None else ex.stats.n_rejected + ex.stats.failed
        return self.before.released + done_here + self.writer.stats["evicted"]

    def _claim_fits(self, reserved: int) -> bool:
        released = self._others_released + self._own_released()
        version = int(self.version_fn())
        fits = self.staleness.claim_fits(
            reserved, released=released, credited=self._credited, version=version
        )
        self._claim_blocked = not fits  # the time accounting's claim_wait
        return fits

    def _sync(self) -> None:  # worker thread: storage's view, other workers' releases, dead workers' blocks
        v = self.ledger.refresh()
        own_visible = v.writer_groups(self.writer.writer_id)
        self.staleness.sync(accepted=v.accepted, credited=v.credited, own_visible=own_visible)
        now = time.time()
        peers = self.states.others()
        for peer in peers:
            if peer.updated_at is not None and now - peer.updated_at > self.cfg.rollout.worker_lease_s:
                self._adopt({**self.source.unrecorded(peer.writer, peer.claim_mark), **peer.blocks})
        self._others_released, self._credited = sum(p.released for p in peers), v.credited

    def _adopt(self, blocks: dict[str, dict[str, Any]], own: bool = False) -> None:
        """Take over ``blocks`` (a dead peer's, or ``own`` earlier life's) for their next generation."""
        for b, info in blocks.items():
            block, gen = int(b), int(info["gen"]) + 1
            while (block, gen) not in self._tried:
                self._tried.add((block, gen))
                if self.claims.try_take_over(block, gen, self.writer.writer_id):
                    self.source.adopt(
                        block, gen, [int(p) for p in info["open"]], self.ledger.committed_positions
                    )
                    break
                # An earlier life of this worker took the block over and was killed before its state file
                # said so: the block is still this worker's, so take the next generation (else its open
                # prompts would never run). Another worker's takeover (a lease expiry) wins.
                if not (own and is_incarnation_of(self.states.taken_over_by(block, gen), self.name)):
                    break
                gen += 1

    def _state(self) -> WorkerState:
        s, ex = self.staleness.stat, self.executor
        nxt = 0 if self.source.last is None else self.source.last + 1
        return WorkerState(
            writer=self.name,
            incarnation=self.writer.writer_id,
            epoch=nxt // len(self.rows),
            position=nxt % len(self.rows),
            blocks=self.source.held_state(set(ex.open_keys())),
            accepted=s.accepted,
            rejected=s.rejected - ex.stats.failed - ex.stats.cancelled,
            failed=self.before.failed + ex.stats.failed,
            released=self._own_released(),
            updated_at=time.time(),
            claim_mark=self.source.claim_mark,
            seq=self.states.next_seq(),  # taken last: a put never replaces a state built after this one
        )

    # --- stop: partial episodes, close, summary ---------------------------------------------------------------

    def _keeps_partials(self, stopped_by: StopReason | None) -> bool:
        return self.keeper is not None and stopped_by == "stop_event"  # a graceful stop: cut and keep

    async def _cut_partials(self) -> float:
        assert self.keeper is not None
        self.executor.pause()
        return await self.keeper.astop(self.cfg.rollout.partial_drain_s)

    async def _keep_partials(self, drain_s: float) -> None:
        assert self.keeper is not None
        cancelled, k = self.executor.cancelled_keys(), self.source.k
        await keep_cut(
            self.storage,
            self.keeper,
            writer_id=self.writer.writer_id,
            cancelled=cancelled,
            block_size=k,
            drain_s=drain_s,
        )

    async def _close(self) -> None:
        self.clock.enter("idle")
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.states.put, self._state())
        if self.owns_workflow and self.workflow is not None:
            self.workflow.close()

    async def _summary(self, stopped_by: StopReason, t0: float) -> RolloutSummary:
        self._log_metrics()
        final = await asyncio.to_thread(self.ledger.refresh)
        st, state = self.executor.stats, self._state()
        elapsed = time.monotonic() - t0
        summary = RolloutSummary(
            stopped_by=stopped_by,
            accepted=st.accepted,
            rejected=st.n_rejected - st.rejected.get("skipped", 0),
            failed=st.failed,
            skipped=st.rejected.get("skipped", 0),
            total_accepted=sum(n for w, n in final.by_writer.items() if is_incarnation_of(w, self.name)),
            epoch=state.epoch,
            position=state.position,
            tokens=st.tokens,
            tokens_per_s=st.tokens / max(elapsed, 1e-9),
            elapsed_s=elapsed,
            shards=self.writer.stats["shards"],
            bad_rows=self.bad_rows,
            writer=self.writer.writer_id,
        )
        logger.debug("rollout %s stopped (%s): %s", self.name, summary.stopped_by, summary)
        return summary

    def _log_metrics(self) -> None:
        version = self.version_fn()
        wf_metrics = self.workflow.metrics() if self.workflow is not None else {}
        if self.curriculum is not None:
            wf_metrics = {**wf_metrics, **self.curriculum.metrics()}
        if self.review is not None:
            wf_metrics = {**wf_metrics, **self.review.metrics()}
        self.metrics.log(
            rollout_metrics(self.executor.stats, self.staleness, wf_metrics, version), step=version
        )
