"""``inference.n_servers: auto`` and ``inference.server_threads: auto``: size generation to the trainer.

What it is: ``resolve_layout(cfg, cores=None)`` returns ``cfg`` with both fields as numbers, resolved on the
machine that loads the config (``load_config`` calls it, so in distributed mode each worker resolves its
own). The rule, for the CPU server (``inference.backend: local``) with ``C`` usable cores
(``sched_getaffinity``) and a trainer of ``T = train.threads`` torch threads beside it:

    generation cores   G = max(1, C - T)                 the trainer keeps its cores; generation gets the rest
    n_servers: auto    1                                  one server batches every group into one decode batch
    server_threads     max(1, G // n_servers)             (auto) the generation cores split over the servers

One server rather than several is measured, not assumed: on the held-back task on 2 cores, two 1-thread
servers made 1,151 trainer steps in 600 s against 2,456 with one (issue 24). Continuous batching is what
makes a CPU server fast; two servers halve each one's batch and double the per-step overhead.
With ``rollout.pause_during_training`` (the synchronous baseline) nothing runs beside generation, so
``G = C``. SGLang's real server on the CPU (``backend sglang`` with ``inference.sglang.device`` cpu, or
auto on a machine without a CUDA GPU) is sized by the same rule. For SGLang on GPUs and ``external``
servers ``auto`` is refused: their size is GPUs, which ``rollflow plan`` sizes from measured rates
(docs/scale.md).

What it is not: a scheduler. It does not move work at run time; it sets two numbers before the servers
start. ``describe_layout`` says in one line what was chosen and why (the flow logs it).
``recommend_gpu_split`` is the GPU side: inference GPUs per trainer GPU from measured rates (``rollflow
plan`` prints it).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ConfigError

AUTO = "auto"


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def generation_cores(cfg: ExperimentConfig, cores: int) -> int:
    """``G`` of the module docstring."""
    if cfg.rollout.pause_during_training:
        return max(1, cores)
    return max(1, cores - max(1, cfg.train.threads))


def cpu_generation(cfg: ExperimentConfig) -> bool:
    """True when generation runs on this machine's CPU cores: the CPU server, or SGLang on ``device`` cpu."""
    inf = cfg.inference
    if inf.backend == "local":
        return True
    if inf.backend != "sglang" or inf.sglang.device == "cuda":
        return False
    if inf.sglang.device == "cpu":
        return True
    import torch

    return not torch.cuda.is_available()


def resolve_layout(cfg: ExperimentConfig, cores: int | None = None) -> ExperimentConfig:
    """``cfg`` with ``inference.n_servers`` and ``inference.server_threads`` resolved (see the module docstring)."""
    inf = cfg.inference
    if inf.n_servers != AUTO and inf.server_threads != AUTO:
        return cfg
    if not cpu_generation(cfg):
        field = "inference.n_servers" if inf.n_servers == AUTO else "inference.server_threads"
        raise ConfigError(
            field,
            f"'auto' sizes generation on CPU cores (backend local, or sglang on the CPU), not backend "
            f"{inf.backend} on GPUs; set a number "
            "(for GPUs: `rollflow plan` recommends inference GPUs per trainer GPU from measured rates)",
        )
    c = usable_cores() if cores is None else cores
    n = 1 if inf.n_servers == AUTO else int(inf.n_servers)
    threads = max(1, generation_cores(cfg, c) // n) if inf.server_threads == AUTO else int(inf.server_threads)
    return dataclasses.replace(cfg, inference=dataclasses.replace(inf, n_servers=n, server_threads=threads))


def describe_layout(cfg: ExperimentConfig, cores: int | None = None) -> str:
    """One line: the cores, what the trainer and generation get."""
    c = usable_cores() if cores is None else cores
    inf = cfg.inference
    return (
        f"{c} usable core(s): trainer {cfg.train.threads} thread(s); generation {inf.n_servers} "
        f"server(s) x {inf.server_threads} thread(s) (backend {inf.backend})"
    )


@dataclass(frozen=True)
class GpuSplit:
    """Inference GPUs for ``trainer_gpus`` training GPUs, and the arithmetic that gave them."""

    trainer_gpus: int
    inference_gpus: int
    servers: int
    arithmetic: str


def recommend_gpu_split(
    *,
    train_seqs_per_s: float,
    gen_seqs_per_s: float,
    trainer_gpus: int,
    tp_size: int = 1,
) -> GpuSplit:
    """Size generation to the trainer on GPUs (docs/scale.md, "Sizing generation to the trainer").

    ``train_seqs_per_s``: sequences per second the whole trainer (``trainer_gpus`` GPUs) consumes when it
    never waits for data (its compute rate); ``gen_seqs_per_s``: sequences per second one inference server
    of ``tp_size`` GPUs produces at the run's batch size and lengths. Generation must keep up with the
    trainer, so with ``n`` servers ``n * gen_seqs_per_s >= train_seqs_per_s``:

        servers = ceil(train_seqs_per_s / gen_seqs_per_s)       inference GPUs = servers * tp_size

    Rounding up leaves generation the surplus; the staleness bound (``rollout.max_staleness``) holds it
    back, so the cost of the surplus is idle inference time, never off-policy data. Both rates are measured:
    the trainer's from ``train/train_tokens_per_s`` / tokens per sequence (or ``time/trainer/computing_frac``
    of a run), generation's from a run's ``rollout/completions_per_s`` over ``time/server*/busy_frac``.
    """
    if train_seqs_per_s <= 0 or gen_seqs_per_s <= 0 or trainer_gpus < 1 or tp_size < 1:
        raise ConfigError(
            "plan rates",
            "need train_seqs_per_s > 0, gen_seqs_per_s > 0, trainer_gpus >= 1 and tp_size >= 1 "
            f"(got {train_seqs_per_s}, {gen_seqs_per_s}, {trainer_gpus}, {tp_size})",
        )
    servers = max(1, math.ceil(train_seqs_per_s / gen_seqs_per_s - 1e-9))
    arithmetic = (
        f"servers = ceil({train_seqs_per_s:g} seq/s trained / {gen_seqs_per_s:g} seq/s per server) = {servers}; "
        f"inference GPUs = {servers} x tp {tp_size} = {servers * tp_size} for {trainer_gpus} trainer GPU(s) "
        f"({servers * tp_size / trainer_gpus:.2f} per trainer GPU)"
    )
    return GpuSplit(trainer_gpus, servers * tp_size, servers, arithmetic)
