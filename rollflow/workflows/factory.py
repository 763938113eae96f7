"""Build the rollout workflow a config names: ``build_workflow(cfg)`` and ``sampling_params(cfg)``.

What it is: the one place that turns ``rollout.workflow`` (a ``module:Class``) plus
``rollout.workflow_kwargs`` into a ``RolloutWorkflow``, handing it the standard arguments it accepts
(a ``workflow_kwargs`` key it does not accept is a ``ConfigError`` naming it), and the one place that
turns ``rollout.generation`` into ``SamplingParams``. What it is not: a workflow (those live
beside it in ``rollflow/workflows/``), nor the loop that runs one (``rollflow/rollout/``).
"""

from __future__ import annotations

import inspect
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.api.errors import ConfigError
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
    reward_workers, reward_timeout_s, and max_staleness (``AgentWorkflow``: a per-episode bound). A class
    without ``**kwargs`` only gets those it names; ``workflow_kwargs`` override them.

    Raises:
        ConfigError: ``rollout.workflow_kwargs`` names an argument the workflow does not take (the
            message names them and lists the ones it does).
        WorkflowImportError: ``rollout.workflow`` does not name a ``RolloutWorkflow`` subclass.
    """
    cls = import_string(cfg.rollout.workflow)
    standard: dict[str, Any] = {
        "reward_fn": cfg.dataset.reward_fn,
        "tokenizer": tokenizer if tokenizer is not None else cfg.model.path,
        "sampling": sampling_params(cfg),
        "group_size": cfg.rollout.group_size,
        "reward_workers": cfg.rollout.reward_workers,
        "reward_timeout_s": cfg.rollout.reward_timeout_s,
        "max_staleness": cfg.rollout.max_staleness,
    }
    extra = dict(cfg.rollout.workflow_kwargs)
    if isinstance(cls, type):
        named, takes_any = workflow_arguments(cls)
        if not takes_any:
            standard = {k: v for k, v in standard.items() if k in named}
            unknown = sorted(set(extra) - set(named))
            if unknown:
                verb = "is not an argument" if len(unknown) == 1 else "are not arguments"
                raise ConfigError(
                    "rollout.workflow_kwargs",
                    f"{', '.join(unknown)} {verb} of {cfg.rollout.workflow}; it takes "
                    f"{', '.join(named) or 'no arguments'}. Remove or rename them",
                )
        elif "max_staleness" not in named:  # the per-episode bound goes only to a workflow that names it
            del standard["max_staleness"]
    return resolve_workflow(cls, **{**standard, **extra})


def workflow_arguments(cls: type) -> tuple[list[str], bool]:
    """The keyword arguments ``cls(...)`` names, in signature order, and whether it takes ``**kwargs``."""
    if cls.__init__ is object.__init__:  # type: ignore[misc]
        return [], False
    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [name for name, p in params.items() if name != "self" and p.kind in keyword]
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
