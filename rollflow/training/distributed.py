"""Process-group setup and model wrapping for the three trainer modes: single, DDP and FSDP2.

What it is: ``DistContext`` (rank, world size, device, and the few collectives the trainer needs:
barrier, byte broadcast / gather over a gloo group, float all-reduce), ``wrap_model`` (FSDP2
``fully_shard`` per decoder layer + root, or DDP, or nothing), full (unsharded) state dicts for
publishing and resume points, gradient-sync control for gradient accumulation, and global grad-norm
clipping that works on DTensor (FSDP2) gradients.
What it is not: the training step or the data split (``microbatch.plan_step``).

Under torchrun the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) picks the ranks; the
backend is NCCL on CUDA and gloo on CPU. Byte payloads (the batch, JSON) always travel over a gloo group
as uint8 tensors, never through pickle (``broadcast_object_list`` pickles, so it is not used).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from rollflow.api.errors import TrainerError

logger = logging.getLogger(__name__)

DistMode = Literal["none", "ddp", "fsdp2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DistContext:
    """Who this process is and how it talks to its peers. ``mode == "none"`` means one process."""

    mode: DistMode = "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    cpu_group: Any = None  # gloo ProcessGroup for byte payloads (None: the default group is gloo)
    owns_group: bool = False  # init_process_group was called here, so shutdown() destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mode != "none"

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.cpu_group)

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes:
        """Rank ``src`` sends ``data``; every rank returns it."""
        if not self.distributed:
            assert data is not None
            return data
        n = torch.tensor([len(data) if self.rank == src and data is not None else 0], dtype=torch.int64)
        dist.broadcast(n, src=src, group=self.cpu_group)
        if self.rank == src:
            assert data is not None
            buf = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if len(data)
                else torch.empty(0, dtype=torch.uint8)
            )
        else:
            buf = torch.empty(int(n.item()), dtype=torch.uint8)
        if int(n.item()) > 0:
            dist.broadcast(buf, src=src, group=self.cpu_group)
        return bytes(buf.numpy().tobytes())

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order, on every rank."""
        if not self.distributed:
            return [data]
        n = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, n, group=self.cpu_group)
        longest = max(int(s.item()) for s in sizes)
        buf = torch.zeros(longest, dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(out, buf, group=self.cpu_group)
        return [bytes(t[: int(s.item())].numpy().tobytes()) for t, s in zip(out, sizes, strict=True)]

    def all_reduce(self, values: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
        """All-reduce a small CPU tensor (metrics) over the gloo group; returns a new tensor."""
        out = values.detach().to("cpu", torch.float64).clone()
        if self.distributed:
            dist.all_reduce(
                out, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.cpu_group
            )
        return out

    def shutdown(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


def init_distributed(mode: DistMode, *, timeout_s: float = 1800.0) -> DistContext:
    """Join (or create) the process group for ``mode``; ``none`` needs no group and refuses WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if mode == "none":
        if world > 1:
            raise TrainerError(
                f"WORLD_SIZE={world} but train.distributed=none; set train.distributed=fsdp2 (GPU) or ddp"
            )
        return DistContext(mode="none", device=torch.device("cuda:0" if cuda else "cpu"))
    if mode not in ("ddp", "fsdp2"):
        raise TrainerError(f"unknown train.distributed {mode!r}; use none, ddp or fsdp2")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        if "RANK" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:  # one process without torchrun: a private world of one (exercises the same code path)
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, timeout=timeout
            )
        owns = True
    cpu_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    ctx = DistContext(
        mode=mode,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        cpu_group=cpu_group,
        owns_group=owns,
    )
    logger.info("rank %d/%d on %s (%s)", ctx.rank, ctx.world_size, device, mode)
    return ctx


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user module inside a DDP wrapper (FSDP2 shards in place, so it needs no unwrapping)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _block_classes(model: torch.nn.Module) -> set[str]:
    names = getattr(model, "_no_split_modules", None) or []
    return set(names)


def wrap_model(model: torch.nn.Module, ctx: DistContext, *, bf16: bool = False) -> torch.nn.Module:
    """Move to the device and wrap for ``ctx.mode``. FSDP2: each transformer block, then the root.

    Parameters stay float32 (the master copy); bf16 compute is FSDP2's MixedPrecisionPolicy there and
    autocast elsewhere (``actor.py``).
    """
    model = model.to(ctx.device)
    if ctx.mode == "none":
        return model
    if ctx.mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            broadcast_buffers=False,  # rotary caches are not trained; avoids a collective per forward
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    blocks = _block_classes(model)
    n = 0
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mp_policy=mp)
            n += 1
    fully_shard(model, mp_policy=mp)
    logger.info(
        "FSDP2: sharded %d blocks (%s) + root over %d ranks", n, ",".join(sorted(blocks)), ctx.world_size
    )
    return model


def freeze_reference(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """A reference model: eval mode, no grads; sharded like the policy under FSDP2, replicated otherwise."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    model = model.to(ctx.device)
    if ctx.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():
            if type(module).__name__ in _block_classes(model):
                fully_shard(module)
        fully_shard(model)
    return model


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, ctx: DistContext, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter for all but the last micro-batch of a minibatch."""
    if ctx.mode == "ddp" and not enabled:
        with model.no_sync():  # type: ignore[operator]
            yield
    elif ctx.mode == "fsdp2":
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
    else:
        yield


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Global L2 grad norm (over all ranks' shards under FSDP2), clipping to ``max_norm`` if > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(total, "full_tensor"):  # DTensor under FSDP2
        total = total.full_tensor()
    return float(total.item())


# --- full state dicts (rank 0 holds them; other ranks get {}) ---------------------------------------------


def full_model_state_dict(
    model: torch.nn.Module, ctx: DistContext, *, trainable_only: bool = False
) -> dict[str, torch.Tensor]:
    """Unsharded float tensors on CPU, cloned (safe to serialise while training goes on). Collective.

    ``trainable_only``: only parameters that require grad (a LoRA adapter, without the frozen base).
    """
    if ctx.mode == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
        sd = get_model_state_dict(model, options=opts)
        return {k: v.detach().clone() for k, v in sd.items()} if ctx.is_main else {}
    if not ctx.is_main:
        return {}
    module = unwrap(model)
    keep = {n for n, p in module.named_parameters() if p.requires_grad} if trainable_only else None
    return {
        k: v.detach().to("cpu", copy=True)
        for k, v in module.state_dict().items()
        if keep is None or k in keep
    }


def full_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext
) -> dict[str, Any]:
    """``{"state": {param_fqn: {name: tensor}}, "param_groups": [{..., "params": [fqn, ...]}]}``. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=ctx.mode == "fsdp2")
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if not ctx.is_main:
        return {}
    state = {
        fqn: {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v) for k, v in s.items()}
        for fqn, s in osd["state"].items()
    }
    return {"state": state, "param_groups": osd["param_groups"]}


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_sd: dict[str, torch.Tensor],
    optim_sd: dict[str, Any] | None,
    *,
    strict: bool = True,
) -> None:
    """Load full (unsharded) state dicts, which every rank holds, into a possibly sharded model/optimizer.

    ``strict=False``: ``model_sd`` may hold only some parameters (a LoRA adapter); the rest stay.

    Every rank reads the blobs itself rather than rank 0 broadcasting them: torch's
    ``broadcast_from_rank0`` ships the dict structure with ``broadcast_object_list`` (pickle).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # The setters rewrite keys of the dicts they are given (DDP's "module." prefix): pass copies.
    opts = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, dict(model_sd), options=opts)
    if optimizer is not None and optim_sd is not None:
        osd = {"state": dict(optim_sd["state"]), "param_groups": [dict(g) for g in optim_sd["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, osd, options=opts)
