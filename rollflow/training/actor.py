"""The policy actor: one rank's forward/backward work of a training step.

What it is: ``PolicyActor`` with the three model-side phases of a step, in the order the trainer calls
them (AReaL's compute_logp / compute_advantages / ppo_update):

1. ``compute_logp`` (no grad): proximal logprobs of the current weights, or reference logprobs with the
   frozen reference model, for this rank's rows only (with ``train.proximal: approx`` the trainer skips
   the proximal pass and ``ppo_update`` interpolates them per token: ``proximal.py``);
2. ``compute_advantages``: group-normalised advantages for the whole batch (cheap, done on every rank);
3. ``ppo_update``: for each PPO minibatch, gradient accumulation over this rank's micro-batches, one
   all-reduce (DDP) / reduce-scatter (FSDP2) on the last micro-batch, grad clipping, one AdamW step.

Loss normalisation across micro-batches and ranks: each micro-batch loss is divided by the token (or
sequence) count of the whole minibatch over all ranks, and multiplied by ``world_size`` because DDP and
FSDP2 average gradients over ranks. The summed gradient therefore equals the gradient of the full-batch
loss, whatever the split (tested: 2 ranks == 1 rank).

What it is not: data loading, publishing or resume points (``trainer.py``), or the loss math itself
(``losses.py``, ``kl.py``, ``advantages.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict
from typing import Any

import torch

from rollflow.api.config import TrainConfig
from rollflow.training.advantages import group_advantages, shape_rewards
from rollflow.training.batching import TrainBatch
from rollflow.training.distributed import DistContext, clip_grad_norm, grad_sync
from rollflow.training.kl import kl_estimate
from rollflow.training.logprobs import forward_logprobs
from rollflow.training.losses import aggregate, ppo_actor_loss
from rollflow.training.microbatch import MinibatchPlan
from rollflow.training.proximal import approx_proximal_logp, weights_version

logger = logging.getLogger(__name__)

_SUM_KEYS = (
    "entropy",
    "clip_frac",
    "dual_clip_frac",
    "behav_masked_frac",
    "behav_weight_mean",
    "approx_kl",
    "kl",
)


class PolicyActor:
    """Runs the model-side phases of a step on one rank (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        ctx: DistContext,
        cfg: TrainConfig,
        *,
        temperature: float = 1.0,
        pad_id: int = 0,
        loss_max_tokens: int | None = None,
    ) -> None:
        """``loss_max_tokens``: the constant L of ``loss_agg: seq-mean-token-sum-norm``; default
        ``cfg.loss_agg_max_tokens``; the trainer passes that or the generation budget."""
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.ctx = ctx
        self.cfg = cfg
        self.temperature = temperature if temperature > 0 else 1.0  # greedy rollouts: score unscaled
        self.pad_id = pad_id
        self.bf16 = cfg.dtype == "bfloat16"
        self.loss_max_tokens = loss_max_tokens or cfg.loss_agg_max_tokens or 0
        if cfg.loss_agg == "seq-mean-token-sum-norm" and self.loss_max_tokens < 1:
            raise ValueError("loss_agg 'seq-mean-token-sum-norm' needs train.loss_agg_max_tokens >= 1")

    # --- helpers ------------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.bf16 and self.ctx.mode != "fsdp2":  # FSDP2 casts through its MixedPrecisionPolicy
            return torch.autocast(device_type=self.ctx.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _dummy_ids(self) -> torch.Tensor:
        return torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.ctx.device)  # [1, 2]

    # --- phase 1: logprobs without grad -------------------------------------------------------------------

    @torch.no_grad()
    def compute_logp(
        self, model: torch.nn.Module, batch: TrainBatch, plans: list[MinibatchPlan]
    ) -> torch.Tensor:
        """Logprobs [B, T] (CPU, float32) of ``model`` on this rank's rows; other rows stay 0.

        Every rank runs the same number of forwards (empty micro-batches run a 2-token dummy), which
        FSDP2's per-forward all-gathers require.
        """
        was_training = model.training
        model.eval()
        out = torch.zeros_like(batch.behav_logp)  # [B, T]
        for plan in plans:
            for groups in plan.micro_batches:
                if not groups:
                    with self._autocast():
                        model(input_ids=self._dummy_ids(), use_cache=False)
                    continue
                rows = batch.rows_of(groups)
                mb = batch.select(rows)
                with self._autocast():
                    logp, _ = forward_logprobs(
                        model, mb.input_ids.to(self.ctx.device), temperature=self.temperature
                    )
                t = mb.input_ids.shape[1]
                out[torch.as_tensor(rows), :t] = logp.float().cpu() * mb.loss_mask
        model.train(was_training)
        return out

    # --- phase 2: advantages ------------------------------------------------------------------------------

    def compute_advantages(self, batch: TrainBatch) -> torch.Tensor:
        """Per-sequence advantages [B] from the shaped rewards (same on every rank)."""
        rewards = shape_rewards(batch.rewards, self.cfg.reward_scale, self.cfg.reward_clip)
        return group_advantages(
            rewards, batch.group_index, estimator=self.cfg.adv_estimator, norm=self.cfg.adv_norm
        )

    # --- phase 3: PPO update ------------------------------------------------------------------------------

    def _normalizer(self, batch: TrainBatch, groups: list[int]) -> float:
        rows = batch.rows_of(groups)
        per_seq = batch.loss_mask[torch.as_tensor(rows)].sum(-1)  # [n]
        if self.cfg.loss_agg == "token-mean":
            return max(1.0, float(per_seq.sum().item()))
        n_seqs = max(1.0, float((per_seq > 0).sum().item()))
        if self.cfg.loss_agg == "seq-mean-token-sum-norm":
            return n_seqs * self.loss_max_tokens  # Dr.GRPO: N_seqs * L, L constant (losses.py)
        return n_seqs

    def ppo_update(
        self, batch: TrainBatch, plans: list[MinibatchPlan], *, version: int | None = None
    ) -> dict[str, float]:
        """``train.ppo_epochs`` passes over the batch, one AdamW update per minibatch in each pass.

        Returns the step's metrics reduced over ranks and averaged over every update (see trainer docs).
        Later passes reuse the same behaviour and proximal logprobs: the ratio pi_theta / pi_prox then
        moves away from 1 and the PPO clip bounds how far each reuse can push (off-policy reuse of the
        batch, GRPO's mu iterations). The lr schedule advances once per step, not once per pass.

        ``version``: the trainer's version V at the step's start, which ``train.proximal: approx`` needs
        (the proximal logprobs are then interpolated from each micro-batch's own forward, no
        ``batch.prox_logp``; ``proximal.py``).
        """
        assert batch.advantages is not None, "compute_advantages first"
        cfg, ctx, dev = self.cfg, self.ctx, self.ctx.device
        approx = cfg.use_decoupled_loss and cfg.proximal == "approx"
        if approx and version is None:
            raise ValueError("train.proximal 'approx' needs ppo_update(..., version=the trainer's version)")
        decoupled = cfg.use_decoupled_loss and (approx or batch.prox_logp is not None)
        per_step = len(plans) * cfg.ppo_epochs  # optimizer updates this step: U of proximal.py
        applied = 0
        self.model.train()
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float64, device=dev))
        w_max = torch.zeros((), dtype=torch.float64, device=dev)
        grad_norms: list[float] = []
        skipped = 0
        for plan in [p for _ in range(cfg.ppo_epochs) for p in plans]:
            norm = self._normalizer(batch, plan.groups)
            self.optimizer.zero_grad(set_to_none=True)
            for i, groups in enumerate(plan.micro_batches):
                last = i == plan.n_micro - 1
                with grad_sync(self.model, ctx, enabled=last):
                    if not groups:  # keeps the collectives of every rank in step
                        with self._autocast():
                            out = self.model(input_ids=self._dummy_ids(), use_cache=False)
                        (out.logits.float().sum() * 0.0).backward()
                        continue
                    mb = batch.select(batch.rows_of(groups)).to(dev)
                    mask = mb.loss_mask  # [b, t]
                    with self._autocast():
                        logp, entropy = forward_logprobs(
                            self.model, mb.input_ids, temperature=self.temperature, entropy_mask=mask
                        )
                    if approx:  # the weights sit at v_c = V + u / U, u = the updates applied so far
                        v_c = weights_version(version, applied, per_step)  # type: ignore[arg-type]
                        prox = approx_proximal_logp(
                            mb.behav_logp, logp, mb.versions, proximal_version=version, current_version=v_c
                        )  # type: ignore[arg-type]  # [b, t]
                    else:
                        prox = mb.prox_logp if decoupled else mb.behav_logp  # [b, t]
                    adv = mb.advantages[:, None].expand_as(mask)  # type: ignore[index]  # [b, t]
                    res = ppo_actor_loss(
                        logp,
                        prox,  # type: ignore[arg-type]
                        mb.behav_logp,
                        adv,
                        mask,
                        eps_clip=cfg.eps_clip,
                        eps_clip_higher=cfg.eps_clip_higher,
                        c_clip=cfg.c_clip,
                        behav_imp_weight_cap=cfg.behav_imp_weight_cap if decoupled else None,
                        behav_imp_weight_mode=cfg.behav_imp_weight_mode,
                    )
                    token_loss = res.token_loss  # [b, t]
                    if mb.ref_logp is not None and cfg.kl_ctl > 0:
                        kl = kl_estimate(logp, mb.ref_logp, cfg.kl_estimator)  # [b, t]
                        kl = torch.where(mask.bool(), kl, torch.zeros_like(kl))  # [b, t] no 0 * NaN
                        token_loss = token_loss + cfg.kl_ctl * kl
                        sums["kl"] += kl.detach().sum().double()
                    loss = aggregate(token_loss, mask, cfg.loss_agg, normalizer=norm)
                    (loss * ctx.world_size).backward()
                with torch.no_grad():
                    m = mask.bool()
                    sums["loss"] += loss.detach().double()
                    sums["n_tok"] += m.sum().double()
                    sums["entropy"] += (entropy * mask).sum().double()  # type: ignore[operator]
                    sums["clip_frac"] += res.clipped.sum().double()
                    sums["dual_clip_frac"] += res.dual_clipped.sum().double()
                    sums["behav_masked_frac"] += res.cap_masked.sum().double()
                    sums["behav_weight_mean"] += (res.behav_weight * mask).sum().double()
                    sums["approx_kl"] += res.approx_kl.sum().double()
                    if m.any():
                        w_max = torch.maximum(w_max, res.behav_weight[m].max().double())
            gn = clip_grad_norm(self.model, cfg.grad_clip)
            grad_norms.append(gn)
            if math.isfinite(gn):
                self.optimizer.step()
                applied += 1
            else:  # every rank sees the same (all-reduced) norm, so every rank skips together
                skipped += 1
                logger.warning("non-finite grad norm %s: skipping this optimizer update", gn)
            self.optimizer.zero_grad(set_to_none=True)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.scheduler.step()
        names = ["loss", "n_tok", *_SUM_KEYS]
        red = ctx.all_reduce(torch.stack([sums[k].to("cpu") for k in names]))
        red_max = ctx.all_reduce(w_max.cpu().reshape(1), op="max")
        total = dict(zip(names, red.tolist(), strict=True))
        n_tok = max(1.0, total["n_tok"])
        metrics = {k: total[k] / n_tok for k in _SUM_KEYS}
        if cfg.kl_ctl <= 0:
            metrics.pop("kl")
        metrics.update(
            loss=total["loss"] / (len(plans) * cfg.ppo_epochs),
            grad_norm=sum(grad_norms) / len(grad_norms),
            lr=lr,
            behav_weight_max=float(red_max.item()),
            loss_tokens=total["n_tok"],
            skipped_updates=float(skipped),
        )
        return metrics
