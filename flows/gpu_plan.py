"""The GPU path resolved without a GPU: config, SGLang commands, torchrun command, pool job variables.

What it is:
- ``torchrun_command``: the trainer's launch line (``flows/train.py`` runs exactly this);
- ``sglang_commands``: one ``sglang.launch_server`` line per server, as ``infra/sglang_launcher``
  builds them (server i on GPUs ``base_gpu_id + i*tp_size`` ..);
- ``pool_job_variables``: what the rollout and train deployments ask of their work pools:
  ``gpu_count = inference.n_servers x inference.sglang.tp_size`` for rollout and
  ``train.nproc_per_node`` for training, and the image (``ROLLFLOW_IMAGE``; missing = an error);
- ``gpu_plan``: all of the above for one config, as the ``async-rl/gpu`` deployment resolves it (its
  ``DEPLOYMENT_OVERRIDES`` first: ``orchestration.mode=distributed``), with a short ``summary`` on top
  (what runs where on how many GPUs), as a dict (``rollflow plan``, a test);
- ``deployment_variables``: a ``prefect deploy`` build step (prefect-gpu.yaml) that returns the job
  variables the GPU deployments template in, and fails the deploy when no image is set.
What it is not: a launcher. Nothing here starts a process or needs CUDA, SGLang or the network.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config, to_yaml


class MissingImageError(ConfigError):
    """A GPU deployment was about to be created without a container image."""


# The overrides the ``async-rl/gpu`` deployment in prefect-gpu.yaml passes (tests/flows/test_gpu_plan.py
# holds the two equal): the plan resolves the config as that deployment runs it, not as a bare
# `rollflow run` would (embedded mode).
DEPLOYMENT_OVERRIDES: tuple[str, ...] = ("orchestration.mode=distributed",)


def torchrun_command(cfg: ExperimentConfig, config: str | None, overrides: list[str]) -> list[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={cfg.train.nproc_per_node}",
        "-m", "rollflow.training.run",
    ]  # fmt: skip
    if config:
        cmd += ["--config", config]
    return cmd + list(overrides)


def sglang_commands(cfg: ExperimentConfig, model_path: str | None = None) -> list[list[str]]:
    from infra.servers import redact_command
    from rollflow.inference.sglang import sglang_command

    inf, sg = cfg.inference, cfg.inference.sglang
    return [
        redact_command(
            sglang_command(
                model_path or cfg.model.path,
                port=(inf.base_port + i) if inf.base_port else 0,
                host=inf.host,
                sglang=sg,
                api_key=inf.api_key,
                weight_version=inf.initial_weight_version,
                base_gpu_id=sg.base_gpu_id + i * sg.tp_size,
            )
        )
        for i in range(inf.n_servers)
    ]


def engine_commands(cfg: ExperimentConfig, model_path: str | None = None) -> dict[str, list[str] | str]:
    """Server 0's launch command for each engine (``rollflow.inference``), redacted; the environment the
    engine adds (e.g. vLLM's ``VLLM_SERVER_DEV_MODE=1``) is not shown. A config an engine refuses gives its
    error instead."""
    from infra.servers import redact_command
    from rollflow.inference.contract import ENGINE_NAMES, LaunchArgs
    from rollflow.inference.engines import engine_for

    inf = cfg.inference
    out: dict[str, list[str] | str] = {}
    for name in ENGINE_NAMES:
        try:
            spec = engine_for(name).launch(LaunchArgs(model_path or cfg.model.path, inf.base_port, inf))
            out[name] = redact_command(spec.command)
        except ConfigError as e:
            out[name] = f"refused: {e}"
    return out


def rollout_gpu_count(cfg: ExperimentConfig) -> int:
    return cfg.inference.n_servers * cfg.inference.sglang.tp_size


def require_image(image: str | None) -> str:
    if not image or not image.strip():
        raise MissingImageError(
            "ROLLFLOW_IMAGE",
            "the GPU deployments need a container image: build infra/docker/Dockerfile.gpu, push it, and "
            "run `ROLLFLOW_IMAGE=<registry>/rollflow:gpu prefect --no-prompt deploy --all "
            "--prefect-file prefect-gpu.yaml`",
        )
    return image.strip()


def pool_job_variables(cfg: ExperimentConfig, image: str | None) -> dict[str, dict[str, Any]]:
    image = require_image(image)
    return {
        "rollout": {"image": image, "gpu_count": rollout_gpu_count(cfg), "env": {"ROLLFLOW_ROLE": "rollout"}},
        "train": {"image": image, "gpu_count": cfg.train.nproc_per_node, "env": {"ROLLFLOW_ROLE": "train"}},
    }


def gpu_plan(
    config: str | None,
    overrides: list[str] | None = None,
    image: str | None = None,
    *,
    rates: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Everything the GPU deployments would run, resolved and checked, for a human or a test.

    ``overrides`` go on top of ``DEPLOYMENT_OVERRIDES``; ``image`` defaults to ``$ROLLFLOW_IMAGE``.
    ``rates`` = (sequences/s the trainer consumes, sequences/s one inference server produces), measured:
    the plan then recommends the inference GPUs for the trainer's (``split``; docs/scale.md).
    """
    overrides = [*DEPLOYMENT_OVERRIDES, *(overrides or [])]
    cfg = load_config(config, overrides)
    if cfg.inference.backend != "sglang":
        raise ConfigError(
            "inference.backend", f"is {cfg.inference.backend!r}; the GPU path serves with sglang"
        )
    job_variables = pool_job_variables(cfg, image if image is not None else os.environ.get("ROLLFLOW_IMAGE"))
    return {
        "summary": plan_summary(cfg, config, job_variables["train"]["image"], split=split_advice(cfg, rates)),
        "config": to_yaml(cfg),
        "sglang_commands": sglang_commands(cfg),
        "engine_commands": engine_commands(cfg),
        "torchrun_command": torchrun_command(cfg, config, overrides),
        "job_variables": job_variables,
        "gpus": {"rollout": rollout_gpu_count(cfg), "train": cfg.train.nproc_per_node},
    }


def split_advice(cfg: ExperimentConfig, rates: tuple[float, float] | None) -> str:
    """Inference GPUs per trainer GPU from measured rates, with the arithmetic; or how to get the rates."""
    from rollflow.configuration.layout import recommend_gpu_split

    if rates is None:
        return (
            "give --train-seqs-per-s (the trainer's rate when it never waits) and --gen-seqs-per-s (one "
            "server's rate) from a run's time/... metrics to size generation to the trainer (docs/scale.md)"
        )
    split = recommend_gpu_split(
        train_seqs_per_s=rates[0],
        gen_seqs_per_s=rates[1],
        trainer_gpus=cfg.train.nproc_per_node,
        tp_size=cfg.inference.sglang.tp_size,
    )
    have = cfg.orchestration.n_rollout_workers * cfg.inference.n_servers
    verdict = "as configured" if have == split.servers else f"configured: {have}"
    return f"{split.arithmetic}; {split.servers} server(s) in all ({verdict})"


def plan_summary(cfg: ExperimentConfig, config: str | None, image: str, *, split: str = "") -> str:
    """A dozen lines on what runs where, on how many GPUs; the plan's details follow it."""
    from rollflow.configuration.redact import redact_url

    inf, orch, train = cfg.inference, cfg.orchestration, cfg.train
    per_rollout = rollout_gpu_count(cfg)
    servers = f"{inf.n_servers} SGLang server(s) x tp_size {inf.sglang.tp_size} = {per_rollout} GPU(s)"
    lines = [f"GPU plan for {config or 'the defaults'} (experiment {cfg.experiment}, model {cfg.model.path})"]
    if orch.mode == "distributed":
        total = orch.n_rollout_workers * per_rollout + train.nproc_per_node + per_rollout
        lines += [
            f"  orchestration: distributed: async-rl/gpu triggers {orch.train_deployment} and "
            f"{orch.n_rollout_workers} x {orch.rollout_deployment}, then waits for them",
            f"  rollout: {servers} per {orch.rollout_deployment} run",
            f"  train:   torchrun --nproc_per_node={train.nproc_per_node} ({train.distributed}) = "
            f"{train.nproc_per_node} GPU(s), {train.steps} steps",
            f"  eval:    async-rl/gpu serves the policy itself for its evaluations: {servers} on the machine "
            "of the worker that runs it",
            f"  GPUs:    {total} in all ({orch.n_rollout_workers} x {per_rollout} rollout + "
            f"{train.nproc_per_node} train + {per_rollout} eval)",
        ]
    else:
        lines += [
            "  orchestration: embedded: servers, rollout and training in one flow run, on one machine",
            f"  GPUs:    {per_rollout + train.nproc_per_node} ({servers} + {train.nproc_per_node} train)",
        ]
    lines += [
        f"  image:   {image}",
        f"  storage: {redact_url(cfg.storage.root)}/{cfg.experiment}/<trial> (shared by every run)",
        f"  mlflow:  {redact_url(cfg.tracking.mlflow_tracking_uri or '$MLFLOW_TRACKING_URI')}",
        *([f"  split:   {split}"] if split else []),
        "Below: the resolved config (YAML), then the SGLang and torchrun commands and the pools' job "
        "variables (JSON).",
    ]
    return "\n".join(lines)


def deployment_variables(config: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """``prefect deploy`` build step: flat values for prefect-gpu.yaml to template in."""
    cfg = load_config(config, list(overrides or []))
    jv = pool_job_variables(cfg, os.environ.get("ROLLFLOW_IMAGE"))
    return {
        "image": jv["rollout"]["image"],
        "rollout_gpu_count": jv["rollout"]["gpu_count"],
        "train_gpu_count": jv["train"]["gpu_count"],
    }
