"""Build the rollout workflow a config names: ``build_workflow(cfg)`` and ``sampling_params(cfg)``.

What it is: the one place that turns ``rollout.workflow`` (a ``module:Class`` or ``module:function``) plus
``rollout.workflow_kwargs`` into a ``RolloutWorkflow``, handing it the standard arguments it accepts, and the
one place that turns ``rollout.generation`` into ``SamplingParams``. What it is not: a workflow (those live
beside it in ``rollflow/workflows/``), nor the loop that runs one (``rollflow/rollout/``).
"""

from __future__ import annotations

import inspect
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.inference import SamplingParams
from rollflow.api.workflow import RolloutWorkflow, import_string, resolve_workflow


def sampling_params(cfg: ExperimentConfig) -> SamplingParams:
    """``rollout.generation`` as the engine contract's ``SamplingParams``."""
    g = cfg.rollout.generation
    return SamplingParams(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        min_p=g.min_p,
        stop_token_ids=list(g.stop_token_ids),
    )


def build_workflow(cfg: ExperimentConfig, *, tokenizer: Any = None) -> RolloutWorkflow:
    """``rollout.workflow`` built with the standard kwargs it accepts, plus ``rollout.workflow_kwargs``.

    Standard kwargs: reward_fn, tokenizer (default: ``model.path``), sampling, group_size,
    reward_workers, reward_timeout_s. A class without ``**kwargs`` only gets those it names; one that
    names ``max_staleness`` (``AgentWorkflow``: a per-episode bound) gets ``rollout.max_staleness``.
    """
    cls = import_string(cfg.rollout.workflow)
    standard: dict[str, Any] = {
        "reward_fn": cfg.dataset.reward_fn,
        "tokenizer": tokenizer if tokenizer is not None else cfg.model.path,
        "sampling": sampling_params(cfg),
        "group_size": cfg.rollout.group_size,
        "reward_workers": cfg.rollout.reward_workers,
        "reward_timeout_s": cfg.rollout.reward_timeout_s,
    }
    if isinstance(cls, type):
        params = {} if cls.__init__ is object.__init__ else inspect.signature(cls.__init__).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            standard = {k: v for k, v in standard.items() if k in params}
        if "max_staleness" in params:
            standard["max_staleness"] = cfg.rollout.max_staleness
    return resolve_workflow(cls, **{**standard, **cfg.rollout.workflow_kwargs})
