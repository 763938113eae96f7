"""The GPU path resolved without a GPU: config, SGLang commands, torchrun command, pool job variables.

What it is:
- ``torchrun_command``: the trainer's launch line (``flows/train.py`` runs exactly this; with
  ``train.nnodes > 1`` every node runs it, ``flows/train_node.py`` on nodes 1..N-1), with the c10d
  rendezvous at ``rdzv_endpoint`` (``$ROLLFLOW_RDZV_ENDPOINT``, else ``train.rdzv_endpoint``);
- ``sglang_commands``: one ``sglang.launch_server`` line per server, as ``infra/sglang_launcher``
  builds them (server i on GPUs ``base_gpu_id + i*tp_size`` ..);
- ``pool_job_variables``: what the GPU deployments ask of their work pools:
  ``gpu_count = inference.n_servers x inference.sglang.tp_size`` for rollout,
  ``train.nproc_per_node`` per trainer pod, one server's ``tp_size`` for the ``async-rl/gpu`` parent's
  evaluation server, and the image (``ROLLFLOW_IMAGE``; missing = an error);
- ``total_gpus``: the GPUs of a whole run by role, the count ``rollflow plan`` and docs/gpu.md quote;
- ``gpu_plan``: all of the above for one config, as the ``async-rl/gpu`` deployment resolves it (its
  ``DEPLOYMENT_OVERRIDES`` first: ``orchestration.mode=distributed``; a config that names its own
  ``orchestration.mode``, like the one-node ``configs/qwen_1node.yaml``, keeps it), with a short
  ``summary`` on top (what runs where on how many GPUs), as a dict (``rollflow plan``, a test);
- ``deployment_variables``: a ``prefect deploy`` build step (prefect-gpu.yaml) that returns the config
  (``$ROLLFLOW_CONFIG``) and the job variables the GPU deployments template in, and fails the deploy
  when no image is set.
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


# Set per job by the Kubernetes pool (infra/work_pools/kubernetes-gpu.json): pod 0's DNS name.
RDZV_ENV = "ROLLFLOW_RDZV_ENDPOINT"
RDZV_JOIN_TIMEOUT_S = 1800


def rdzv_endpoint(cfg: ExperimentConfig) -> str:
    """Where the ``train.nnodes`` torchrun agents meet: ``$ROLLFLOW_RDZV_ENDPOINT``, else the config's."""
    endpoint = os.environ.get(RDZV_ENV, "").strip() or cfg.train.rdzv_endpoint.strip()
    if not endpoint:
        raise ConfigError(
            "train.rdzv_endpoint",
            f"train.nnodes={cfg.train.nnodes} needs a rendezvous every node reaches: set it to host:port "
            f"(node 0's address, e.g. trainer-0.rollflow-train:29400) or export {RDZV_ENV}",
        )
    return endpoint


def torchrun_command(
    cfg: ExperimentConfig, config: str | None, overrides: list[str], *, endpoint: str | None = None
) -> list[str]:
    """One node's torchrun agent; with ``train.nnodes > 1`` every node runs this same line and the
    c10d rendezvous (``--rdzv_id`` = experiment/trial, so two trials never meet) numbers the nodes."""
    train = cfg.train
    nodes = (
        [
            f"--nnodes={train.nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint or rdzv_endpoint(cfg)}",
            f"--rdzv_id={cfg.experiment}-{cfg.trial}",
            # nodes 1..N-1 start at once, node 0 only after its flow has bootstrapped the model
            # (a download, for a hub model): wait for it longer than torchrun's default 600 s
            f"--rdzv_conf=join_timeout={RDZV_JOIN_TIMEOUT_S}",
        ]
        if train.nnodes > 1
        else []
    )  # fmt: skip
    cmd = [
        sys.executable, "-m", "torch.distributed.run", *nodes,
        f"--nproc_per_node={train.nproc_per_node}",
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
                dtype=cfg.model.dtype,
                pause_mode=inf.update_pause_mode,
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


def eval_gpu_count(cfg: ExperimentConfig) -> int:
    """GPUs of the distributed parent (``async-rl/gpu``): one evaluation server of ``tp_size`` GPUs
    (``flows.distributed.eval_config``), whatever ``inference.n_servers`` the rollout workers use."""
    return cfg.inference.sglang.tp_size


def total_gpus(cfg: ExperimentConfig) -> dict[str, int]:
    """GPUs by role for the config's mode; ``total`` is what the docs and ``rollflow plan`` count.

    distributed: ``n_rollout_workers x n_servers x tp_size`` (rollout) + ``nnodes x nproc_per_node``
    (train) + ``tp_size`` (the parent's one evaluation server). embedded: the servers and the trainer
    (one GPU, in the flow process) on one machine; evaluation shares the servers.
    """
    rollout, train = rollout_gpu_count(cfg), cfg.train.nnodes * cfg.train.nproc_per_node
    if cfg.orchestration.mode == "distributed":
        parts = {"rollout": cfg.orchestration.n_rollout_workers * rollout, "train": train}
        parts["eval"] = eval_gpu_count(cfg)
    else:  # the trainer runs in the flow process: one GPU (tasks/train.py)
        parts = {"rollout": rollout, "train": 1, "eval": 0}
    return {**parts, "total": sum(parts.values())}


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
        "parent": {"image": image, "gpu_count": eval_gpu_count(cfg), "env": {"ROLLFLOW_ROLE": "parent"}},
    }


def gpu_plan(
    config: str | None,
    overrides: list[str] | None = None,
    image: str | None = None,
    *,
    rates: tuple[float, float] | None = None,
    gpu_gb: float = 80.0,
) -> dict[str, Any]:
    """Everything the GPU deployments would run, resolved and checked, for a human or a test.

    ``gpu_gb``: the memory of one GPU; the summary's ``memory`` line says whether the trainer fits in it
    (beside SGLang where they share a GPU), estimated by ``rollflow.configuration.gpu_memory``.

    ``overrides`` go on top of ``DEPLOYMENT_OVERRIDES``, unless the config file sets
    ``orchestration.mode`` itself (``configs/qwen_1node.yaml`` says ``embedded``: one machine, no pools,
    no image needed); ``image`` defaults to ``$ROLLFLOW_IMAGE``.
    ``rates`` = (sequences/s the trainer consumes, sequences/s one inference server produces), measured:
    the plan then recommends the inference GPUs for the trainer's (``split``; docs/scale.md).
    """
    own_mode = _sets_mode(config)
    overrides = [*([] if own_mode else DEPLOYMENT_OVERRIDES), *(overrides or [])]
    cfg = load_config(config, overrides)
    if cfg.inference.backend != "sglang":
        raise ConfigError(
            "inference.backend", f"is {cfg.inference.backend!r}; the GPU path serves with sglang"
        )
    image = image if image is not None else os.environ.get("ROLLFLOW_IMAGE")
    embedded = cfg.orchestration.mode == "embedded"
    job_variables = {} if embedded and not (image or "").strip() else pool_job_variables(cfg, image)
    shown_image = (
        job_variables["train"]["image"] if job_variables else "none needed (one machine, this checkout)"
    )
    endpoint = None if cfg.train.nnodes == 1 or _has_endpoint(cfg) else f"${RDZV_ENV}"
    return {
        "summary": plan_summary(cfg, config, shown_image, split=split_advice(cfg, rates), gpu_gb=gpu_gb),
        "config": to_yaml(cfg),
        "sglang_commands": sglang_commands(cfg),
        "engine_commands": engine_commands(cfg),
        "torchrun_command": torchrun_command(cfg, config, overrides, endpoint=endpoint),
        "job_variables": job_variables,
        "gpus": total_gpus(cfg),
    }


def _sets_mode(config: str | None) -> bool:
    """Whether the YAML file names ``orchestration.mode`` itself (then the plan keeps it)."""
    if not config:
        return False
    import yaml

    with open(config, encoding="utf-8") as f:
        raw = yaml.safe_load(f) or {}
    return isinstance(raw.get("orchestration"), dict) and "mode" in raw["orchestration"]


def _has_endpoint(cfg: ExperimentConfig) -> bool:
    try:
        rdzv_endpoint(cfg)
    except ConfigError:
        return False
    return True


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


def train_line(cfg: ExperimentConfig) -> str:
    """The trainer's share of the plan: nodes x ranks, the rendezvous when there are several nodes."""
    train = cfg.train
    line = f"torchrun --nproc_per_node={train.nproc_per_node} ({train.distributed})"
    if train.nnodes > 1:
        where = (
            rdzv_endpoint(cfg) if _has_endpoint(cfg) else f"${RDZV_ENV} (the Kubernetes pool sets it per job)"
        )
        line = f"{train.nnodes} nodes x {line}, c10d rendezvous at {where}"
    return f"{line} = {train.nnodes * train.nproc_per_node} GPU(s), {train.steps} steps"


def plan_summary(
    cfg: ExperimentConfig, config: str | None, image: str, *, split: str = "", gpu_gb: float = 80.0
) -> str:
    """A dozen lines on what runs where, on how many GPUs; the plan's details follow it."""
    from rollflow.configuration.gpu_memory import memory_verdict
    from rollflow.configuration.redact import redact_url

    inf, orch = cfg.inference, cfg.orchestration
    per_rollout = rollout_gpu_count(cfg)
    servers = f"{inf.n_servers} SGLang server(s) x tp_size {inf.sglang.tp_size} = {per_rollout} GPU(s)"
    lines = [f"GPU plan for {config or 'the defaults'} (experiment {cfg.experiment}, model {cfg.model.path})"]
    gpus = total_gpus(cfg)
    if orch.mode == "distributed":
        lines += [
            f"  orchestration: distributed: async-rl/gpu triggers {orch.train_deployment} and "
            f"{orch.n_rollout_workers} x {orch.rollout_deployment}, then waits for them",
            f"  rollout: {servers} per {orch.rollout_deployment} run",
            f"  train:   {train_line(cfg)}",
            f"  eval:    async-rl/gpu serves the policy for its evaluations on one server of "
            f"{inf.sglang.tp_size} GPU(s), kept on the newest version",
            f"  GPUs:    {gpus['total']} in all ({orch.n_rollout_workers} x {per_rollout} rollout + "
            f"{gpus['train']} train + {gpus['eval']} eval)",
        ]
    else:
        first = inf.sglang.base_gpu_id
        lines += [
            "  orchestration: embedded: servers, rollout and training in one flow run, on one machine",
            f"  rollout: {servers}, on GPUs {first}..{first + per_rollout - 1} (inference.sglang.base_gpu_id)",
            "  train:   in the flow process on GPU 0 (cuda:0), one rank; evaluation uses the servers",
            f"  GPUs:    {gpus['total']} ({per_rollout} inference + {gpus['train']} train)",
            *(
                ["  WARNING: server 0 shares GPU 0 with the trainer: set inference.sglang.base_gpu_id: 1"]
                if first == 0
                else []
            ),
        ]
    lines += [
        f"  memory:  {memory_verdict(cfg, gpu_gb)}",
        f"  image:   {image}",
        f"  storage: {redact_url(cfg.storage.root)}/{cfg.experiment}/<trial> (shared by every run)",
        f"  mlflow:  {redact_url(cfg.tracking.mlflow_tracking_uri or '$MLFLOW_TRACKING_URI')}",
        *([f"  split:   {split}"] if split else []),
        "Below: the resolved config (YAML), then the SGLang and torchrun commands and the pools' job "
        "variables (JSON).",
    ]
    return "\n".join(lines)


DEFAULT_CONFIG_ENV = "ROLLFLOW_CONFIG"  # prefect-gpu.yaml's config, resolved at deploy time
DEFAULT_GPU_CONFIG = "configs/gsm8k_qwen.yaml"


def deployment_variables(config: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """``prefect deploy`` build step: flat values for prefect-gpu.yaml to template in.

    ``config``: the YAML every GPU deployment gets as its default ``config`` parameter and whose GPU
    counts size the pools; ``$ROLLFLOW_CONFIG`` when set (so one deploy command serves any config),
    else this argument, else configs/gsm8k_qwen.yaml. A run may still pass another ``config`` (or
    ``settings``); the pools' ``gpu_count`` is what was resolved here, so redeploy when it changes.
    """
    config = os.environ.get(DEFAULT_CONFIG_ENV, "").strip() or config or DEFAULT_GPU_CONFIG
    cfg = load_config(config, [*DEPLOYMENT_OVERRIDES, *(overrides or [])])
    jv = pool_job_variables(cfg, os.environ.get("ROLLFLOW_IMAGE"))
    return {
        "config": config,
        "image": jv["rollout"]["image"],
        "rollout_gpu_count": jv["rollout"]["gpu_count"],
        "train_gpu_count": jv["train"]["gpu_count"],
        "train_nnodes": cfg.train.nnodes,
        "eval_gpu_count": jv["parent"]["gpu_count"],
    }
