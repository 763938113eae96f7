"""The training loop: committed trajectory groups in, published policy versions out.

What it is: ``Trainer(cfg, storage, ...).run()``. One step, with ``version`` = training steps applied:

1. take exactly ``train.batch_size`` groups, oldest first, through the reader's exactly-once cursor;
   groups older than the staleness rule's ``min_trainable_version(version)`` are dropped and counted
   (rank 0 reads, then broadcasts the padded batch to the other ranks as safetensors bytes);
2. plan: PPO minibatches balanced by tokens, each split across ranks by tokens, each rank's share packed
   into micro-batches of <= train.max_tokens_per_mb tokens by first-fit decreasing (groups never split);
3. advantages, proximal logprobs (decoupled loss; none with ``train.proximal: approx``, which
   interpolates them inside the update: ``proximal.py``), reference logprobs (kl_ctl > 0), PPO update(s).
   Without a KL term, groups whose advantages are all 0 (every reward equal) are left out of the
   forward and backward passes: their loss is identically 0, and the loss is still normalised by the
   tokens of the whole minibatch, so the gradient is unchanged (``microbatch.keep_groups``). Under a
   sparse reward most groups are such groups, so this is most of a step's compute. The per-token
   statistics (entropy, clip fraction, ...) are then over the tokens that carry signal;
4. ``version += 1``; every ``checkpoint_every`` versions (and the last) publish a HF checkpoint, the
   upload overlapping the next step unless rollout.pause_during_training (synchronous baseline);
5. write ``trainer/consumed/step-{version:08d}.json`` (group ids trained on: the audit trail), a resume
   point every ``resume_every`` steps, and the step's metrics.

LoRA (``train.lora.rank > 0``, ``lora.py``): the policy is wrapped with ``peft`` before it is wrapped
for DDP/FSDP2, so only the adapter has gradients and optimizer state; a version publishes only the
adapter; the KL reference is the same model with the adapter switched off (``lora.AdapterDisabled``);
resume points hold the adapter and its optimizer state. Everything else (the losses, proximal logprobs,
batching, resume replay) is unchanged.

Startup: a fresh run with no checkpoint in storage publishes the initial weights as version 0; a
restarted run loads the newest resume point (weights, optimizer, scheduler, RNG, cursor, counters) and
goes on from there. Versions already in storage are never re-published (``publish.py``). At the end the
final checkpoint is published and ``trainer/DONE.json`` written, so the rollout side stops. A set
``stop_event`` ends the run after the current step with a resume point and without the done marker.

What it is not: the math (``losses``, ``advantages``, ``kl``), building the policy (``policy_build``), the
per-rank passes (``actor``), the staleness rule (``rollflow.api.staleness``), the reported numbers
(``step_report``), process launch (``run``), or anything Prefect.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import torch

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import TrainerError
from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.api.staleness import min_trainable_version
from rollflow.api.stores import ObjectStore
from rollflow.api.training import TrainerHooks
from rollflow.clock.roles import Timeline
from rollflow.training import distributed as D
from rollflow.training.batching import TrainBatch, build_batch, signal_groups
from rollflow.training.lora import adapter_config, adapter_tensors
from rollflow.training.microbatch import keep_groups, plan_step
from rollflow.training.policy_build import build_policy
from rollflow.training.publish import CheckpointPublisher
from rollflow.training.resume import (
    ResumePoint,
    capture_rng,
    drop_replayed_logs,
    find_latest_resume_point,
    gc_resume_points,
    load_resume_blobs,
    load_scheduler_state,
    read_resume_point,
    restore_rng,
    scheduler_state,
    write_resume_point,
)
from rollflow.training.source import BatchCollector, Collected
from rollflow.training.step_report import TrainSummary, data_metrics, step_metrics
from storage import keys

logger = logging.getLogger(__name__)

KEEP_RESUME_POINTS = 2


class Trainer:
    """See the module docstring. Construct on every rank (torchrun) with the same config."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        storage: ObjectStore,
        *,
        metrics: MetricsSink | None = None,
        stop_event: threading.Event | None = None,
        hooks: TrainerHooks | None = None,
        dist_ctx: D.DistContext | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.cfg = cfg
        self.timeline = timeline
        # the ``trainer`` role of the run's time accounting (rollflow.clock.roles): where each step goes
        self.clock = (timeline or Timeline()).role("trainer", initial="other")
        self.storage = storage
        self.metrics = metrics or NullSink()
        self.stop_event = stop_event or threading.Event()
        self.hooks = hooks
        self._ctx_given = dist_ctx is not None
        self.ctx = dist_ctx
        self.lora = cfg.train.lora.enabled  # train and publish a LoRA adapter, not the full weights
        self.version = 0
        self.counters = {"groups_consumed": 0, "dropped_stale": 0, "quarantined": 0}
        self.publisher: CheckpointPublisher | None = None  # rank 0 only
        self._last_resume_version = 0  # version 0 needs none: a fresh start rebuilds it
        self._step_cursor: dict[str, Any] = {}  # reader cursor after the last completed step (rank 0)
        self._pending_cursor: dict[str, Any] = {}  # reader cursor after the batch in hand (rank 0)
        self._waiting_for_data = False  # rank 0 is between steps, waiting for groups

    # --- setup --------------------------------------------------------------------------------------------

    def _version_ceiling(self) -> int | None:
        """``max(LATEST, self.version)``: the newest version a trained token may carry (see ``setup``)."""
        latest = self.store.latest_version()
        return self.version if latest is None else max(latest, self.version)

    def _setup(self) -> None:
        from transformers.utils import logging as hf_logging

        from storage.checkpoints import CheckpointStore
        from storage.shard_reader import ShardReader

        cfg, tcfg = self.cfg, self.cfg.train
        hf_logging.disable_progress_bar()
        torch.set_num_threads(max(1, tcfg.threads))
        if self.ctx is None:
            self.ctx = D.init_distributed(
                tcfg.distributed, timeout_s=max(1800.0, tcfg.data_wait_timeout_s + 600)
            )
        ctx = self.ctx
        policy = build_policy(cfg, ctx)  # seeds every RNG with seed + rank first
        self.tokenizer, self.model, self.ref_model = policy.tokenizer, policy.model, policy.ref_model
        self.optimizer, self.scheduler, self.actor = policy.optimizer, policy.scheduler, policy.actor
        self.hf_config, self.generation_config = policy.hf_config, policy.generation_config
        self.architecture, self.tied = policy.architecture, policy.tied
        self.store = CheckpointStore(self.storage, ack_ttl_s=cfg.storage.ack_ttl_s)
        # Token ids are checked against the policy's vocabulary at read time: a shard holding an id the
        # embedding cannot look up is quarantined, instead of crashing this step and every restart.
        vocab = int(D.unwrap(self.model).get_input_embeddings().num_embeddings)  # DDP wraps the module
        # A trained token newer than every policy that could have generated it is refused: the ceiling is
        # the newer of LATEST and this trainer's own version (a trainer resumed from an older point trains
        # tokens up to LATEST; a version it made but has not published yet may already be LATEST's next).
        self.reader = (
            ShardReader(self.storage, vocab_size=vocab, version_ceiling=self._version_ceiling)
            if ctx.is_main
            else None
        )
        # Local storage: a poll is a directory listing, so poll every 50 ms and a synchronous step waits
        # for no poll; object stores bill each LIST, so there the interval backs off to 2 s when idle.
        local = self.storage.is_local
        self.collector = (
            BatchCollector(
                self.reader,
                timeout_s=tcfg.data_wait_timeout_s,
                stop_event=self.stop_event,
                poll_interval_s=0.05 if local else 0.2,
                max_poll_interval_s=0.05 if local else 2.0,
            )
            if self.reader is not None
            else None
        )

    def _startup_plan(self) -> dict[str, Any]:
        """Rank 0 reads storage once and tells every rank: resume step, newest committed version."""
        plan: dict[str, Any] | None = None
        if self.ctx.is_main:  # type: ignore[union-attr]
            point = find_latest_resume_point(self.storage)
            # the newest version with a COMMIT.json, readable or not: one whose commit is corrupt must
            # not be re-published either (the watchers fall back past it until the next version)
            committed = self.store.list_committed()
            plan = {
                "resume_step": point.step if point is not None else None,
                "floor": committed[-1] if committed else -1,
            }
        raw = self.ctx.broadcast_bytes(json.dumps(plan).encode() if plan is not None else None)  # type: ignore[union-attr]
        return json.loads(raw)

    def _resume(self, step: int) -> None:
        from storage.shard_reader import ReaderCursor

        ctx = self.ctx
        assert ctx is not None
        point = read_resume_point(self.storage, step)
        model_sd, optim_sd = load_resume_blobs(self.storage, point)
        D.load_full_state(self.model, self.optimizer, model_sd, optim_sd, strict=not self.lora)
        del model_sd, optim_sd
        load_scheduler_state(self.scheduler, point.scheduler)
        if len(point.rng) == ctx.world_size:
            restore_rng(point.rng[ctx.rank])
        else:
            logger.warning(
                "resume point has RNG for %d ranks, running %d: RNG reseeded", len(point.rng), ctx.world_size
            )
        self.version = point.version
        self._last_resume_version = point.version
        self.counters.update({k: int(v) for k, v in point.counters.items() if k in self.counters})
        if self.reader is not None:
            self.reader.cursor.update(ReaderCursor.from_json(point.cursor))
            drop_replayed_logs(self.storage, point.version)
        logger.info("resumed from resume point %d (version %d)", point.step, point.version)

    # --- checkpoints and resume points ----------------------------------------------------------------------

    def _snapshot(self) -> dict[str, torch.Tensor]:
        if self.lora:  # the adapter alone, under peft's saved names
            sd = D.full_model_state_dict(self.model, self.ctx, trainable_only=True)  # type: ignore[arg-type]
            return adapter_tensors(sd)
        sd = D.full_model_state_dict(self.model, self.ctx)  # type: ignore[arg-type]  # collective
        return {k: v for k, v in sd.items() if k not in self.tied}

    def _publish(self, *, wait: bool) -> None:
        sd = self._snapshot()
        if self.publisher is not None:
            meta: dict[str, Any] = {
                "trainer": "rollflow",
                "groups_consumed": self.counters["groups_consumed"],
            }
            if self.lora:
                meta.update(
                    kind="adapter", base_model=self.cfg.model.path, lora_rank=self.cfg.train.lora.rank
                )
            self.publisher.submit(self.version, sd, step=self.version, meta=meta)
            if wait:
                self.publisher.flush()

    def _write_resume_point(self) -> None:
        ctx = self.ctx
        assert ctx is not None
        # collectives: every rank takes part; with LoRA the frozen base is left out (re-read on restart)
        model_sd = D.full_model_state_dict(self.model, ctx, trainable_only=self.lora)
        optim_sd = D.full_optimizer_state_dict(self.model, self.optimizer, ctx)
        rngs = [json.loads(b) for b in ctx.all_gather_bytes(json.dumps(capture_rng()).encode())]
        if ctx.is_main:
            point = ResumePoint(
                step=self.version,
                version=self.version,
                cursor=self._step_cursor,
                scheduler=scheduler_state(self.scheduler),
                optimizer_meta={},
                rng=rngs,
                counters=dict(self.counters),
                world_size=ctx.world_size,
            )
            write_resume_point(self.storage, point, model_sd, optim_sd)
            gc_resume_points(self.storage, keep=KEEP_RESUME_POINTS)
        self._last_resume_version = self.version
        ctx.barrier()

    # --- the loop -----------------------------------------------------------------------------------------

    def run(self) -> TrainSummary:
        t_start = time.perf_counter()
        try:
            summary = self._run()
        finally:
            if self.ctx is not None and not self._ctx_given:
                self.ctx.shutdown()
        summary.wall_time_s = time.perf_counter() - t_start
        if summary.done and (self.ctx is None or self.ctx.is_main):
            logger.info("training finished: %s", summary.brief())
        return summary

    def _run(self) -> TrainSummary:
        self._setup()
        ctx, cfg, tcfg = self.ctx, self.cfg, self.cfg.train
        assert ctx is not None
        plan = self._startup_plan()
        resumed_from = None
        if plan["resume_step"] is not None:
            self._resume(int(plan["resume_step"]))
            resumed_from = self.version
        self._step_cursor = self.reader.cursor.to_json() if self.reader is not None else {}
        if ctx.is_main:
            self.publisher = CheckpointPublisher(
                self.store,
                config=self.hf_config,
                tokenizer=self.tokenizer,
                generation_config=self.generation_config,
                architecture=self.architecture,
                dtype=torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32,
                floor=int(plan["floor"]),
                background=not cfg.rollout.pause_during_training,
                keep_last=cfg.storage.keep_checkpoints,
                adapter_config=adapter_config(self.model, cfg.model.path) if self.lora else None,
            )
        if self.version > int(plan["floor"]):  # version 0 on a fresh start, or a resumed version not yet out
            self._publish(wait=True)
        if self.timeline is not None:
            self.timeline.mark_version(self.version)
        summary = TrainSummary(
            final_version=self.version,
            steps_run=0,
            groups_consumed=0,
            dropped_stale=0,
            resumed_from=resumed_from,
        )
        while self.version < tcfg.steps:
            try:
                stepped = self._step()
            except TrainerError as e:
                self._fail_between_steps(e)
                raise
            if not stepped:
                summary.stopped = True
                break
            summary.steps_run += 1
        if self.publisher is not None:
            self.publisher.flush()
        if summary.stopped:
            if self.version > self._last_resume_version:
                self._write_resume_point()
        elif ctx.is_main:
            info = {"version": self.version, "steps": tcfg.steps, **self.counters}
            self.store.mark_done(info)
            summary.done = True
            logger.debug("training done at version %d", self.version)
        ctx.barrier()
        summary.final_version = self.version
        summary.groups_consumed = self.counters["groups_consumed"]
        summary.dropped_stale = self.counters["dropped_stale"]
        summary.quarantined = self.counters["quarantined"]
        summary.published_versions = list(self.publisher.published) if self.publisher is not None else []
        return summary

    def _fail_between_steps(self, error: TrainerError) -> None:
        """The data wait failed (no group within ``data_wait_timeout_s``): the model is at a completed
        step, so write its resume point before the error goes up, and say so in the error. Skipped with
        several ranks (the others wait in a collective) and for errors raised inside a step."""
        ctx = self.ctx
        if not self._waiting_for_data or ctx is None or ctx.distributed:
            return
        self._waiting_for_data = False
        if self.publisher is not None:
            self.publisher.flush()
        if self.version > self._last_resume_version:
            self._write_resume_point()
            note = f"train-loop wrote its resume point at version {self.version}"
        else:
            note = f"train-loop's newest resume point (version {self.version}) is current"
        logger.error("training stops at version %d: %s; %s", self.version, error, note)
        error.args = (f"{error}; {note}",)

    def _take_batch(self) -> tuple[TrainBatch | None, dict[str, float]]:
        """Rank 0 collects and pads; every rank gets the same batch (None: stop)."""
        ctx, cfg = self.ctx, self.cfg
        assert ctx is not None
        info: dict[str, float] = {}
        batch: TrainBatch | None = None
        if ctx.is_main:
            got = None
            if not self.stop_event.is_set():
                assert self.collector is not None
                self._waiting_for_data = True
                oldest = min_trainable_version(self.version, max_staleness=cfg.rollout.max_staleness)
                got = self.collector.collect(cfg.train.batch_size, min_head_version=oldest)
                self._waiting_for_data = False
            if got is not None:
                batch = build_batch(got.groups, pad_id=self.actor.pad_id)
                info = self._data_metrics(got)
                self._pending_cursor = self.reader.cursor.to_json()  # type: ignore[union-attr]
        if not ctx.distributed:
            return batch, info
        raw = ctx.broadcast_bytes(batch.to_bytes() if batch is not None else b"")
        if not raw:
            return None, info
        return (batch if batch is not None else TrainBatch.from_bytes(raw)), info

    def _data_metrics(self, got: Collected) -> dict[str, float]:
        self.counters["groups_consumed"] += len(got.groups)
        self.counters["dropped_stale"] += got.dropped_stale
        self.counters["quarantined"] += got.quarantined
        return data_metrics(got, self.version)

    def _step(self) -> bool:
        """One training step; False if stopped before it began."""
        ctx, cfg, tcfg = self.ctx, self.cfg, self.cfg.train
        assert ctx is not None
        t_take = time.perf_counter()
        self.clock.enter("waiting_data")
        batch, info = self._take_batch()
        self.clock.enter("other")
        take_s = time.perf_counter() - t_take  # reading + padding (+ waiting, if the rollout lags)
        if batch is None:
            return False
        if self.hooks is not None:
            self.hooks.before_step(self.version)
        t0 = time.perf_counter()
        self.clock.enter("computing")
        plans = plan_step(
            [g.n_tokens for g in batch.groups],
            n_minibatches=tcfg.ppo_n_minibatches,
            world_size=ctx.world_size,
            rank=ctx.rank,
            max_tokens_per_mb=tcfg.max_tokens_per_mb,
        )
        batch.advantages = self.actor.compute_advantages(batch)
        signal = signal_groups(batch)
        if self.ref_model is None:  # no KL term: a zero-advantage group has an identically zero loss
            plans = keep_groups(plans, signal, keep_empty=ctx.world_size > 1)
        if tcfg.use_decoupled_loss and tcfg.proximal == "forward":  # "approx": ppo_update interpolates
            batch.prox_logp = self.actor.compute_logp(self.model, batch, plans)
        if self.ref_model is not None:
            batch.ref_logp = self.actor.compute_logp(self.ref_model, batch, plans)
        stats = self.actor.ppo_update(batch, plans, version=self.version)
        self.version += 1
        compute_s = time.perf_counter() - t0
        self.clock.enter("publishing")
        if self.timeline is not None:
            self.timeline.mark_version(self.version)
        if ctx.is_main:
            self._step_cursor = self._pending_cursor
            self.storage.put_json(
                keys.consumed_key(self.version),
                {
                    "step": self.version,
                    "groups": [g.group_id for g in batch.groups],
                    "head_versions": [g.head_version for g in batch.groups],
                    "dropped_stale": int(info.get("dropped_stale", 0)),
                },
            )
        t1 = time.perf_counter()
        if self.version % tcfg.checkpoint_every == 0 or self.version == tcfg.steps:
            self._publish(wait=cfg.rollout.pause_during_training)
        if self.version % tcfg.resume_every == 0 or self.version == tcfg.steps:
            self._write_resume_point()
        step_s = take_s + time.perf_counter() - t0  # the hooks' time is not the trainer's
        self.clock.enter("other")
        if ctx.is_main:
            times = {
                "take_time_s": take_s,
                "compute_time_s": compute_s,
                "checkpoint_time_s": time.perf_counter() - t1,
                "step_time_s": step_s,
            }
            metrics = step_metrics(
                stats, info, batch, version=self.version, n_signal=len(signal), times=times
            )
            self.metrics.log(metrics, step=self.version)
            logger.debug(
                "v%d loss=%.4f reward=%.3f kl~%.4f clip=%.3f %.0f tok/s",
                self.version,
                stats["loss"],
                metrics["reward_mean"],
                stats["approx_kl"],
                stats["clip_frac"],
                metrics["train_tokens_per_s"],
            )
        if self.hooks is not None:
            self.hooks.after_step(self.version)
        return True
