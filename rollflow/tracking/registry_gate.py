"""The registry gate at the end of a trial: decide whether the final policy enters the registry, and do it.

What it is: ``apply_registry_gate`` runs the rule of ``rollflow.tracking.registry.decide_registration``
on a finished trial (it trained, and its held-out accuracy is at least the incumbent's; an incumbent the
run started from is re-scored by the run's "before" evaluation), records the decision on the trial's
MLflow run as tags (``rollflow.registry.decision`` / ``reason`` / ``detail``, and the incumbent's), and
when the gate lets it, fetches the final checkpoint (verified) and registers it with its lineage.
``tracking.register_model: false`` records ``disabled`` and registers nothing.

A LoRA run registers its adapter itself, as users deploy it on an engine that serves adapters: under
the registered model name (the version the decision tags name, the ``latest-rl`` alias moves to it),
tagged ``lora_rank`` and its base's identity (``base_model.py``: ``lora_base_model``, its weights
digest ``lora_base_model_blake3``, a hub base's ``lora_base_model_revision``). With
``tracking.register_merged`` (the default) the adapter merged into its base (``merge_adapter_dir``) is
registered as well, under ``<name>-merged``, tagged ``merged_from = <name> v<n>``; the adapter's version
gets ``merged_model = <name>-merged v<m>`` and the run ``rollflow.registry.merged_model``.
Registering survives a stop half-way (issue 20's failure window: the adapter registered, then the merged
model failed, or the process was killed): the decision is made once and written to the run first, with
``rollflow.registry.stage = registering`` and without ``rollflow.registry.decision``; registration is
idempotent per (run, policy version, model name) (``MlflowTracker.register_checkpoint``); the decision
tag is written last, with the stage ``done``. A resumed finalize (``rollflow.trial.finalization``) finds no decision
tag and calls the gate again, which takes the written decision rather than judging anew (by then the
alias may point at the run's own adapter) and registers only what is missing.
The candidate's scores come from the trial's evaluation records (``eval/v{N}.json``, written by the
evaluation): its mean reward, whether its rewards were binary, the digest of its evaluation set and its
retention accuracies. The decision tags add ``rollflow.registry.metric`` (accuracy or mean_reward),
``eval_set``, ``comparable`` and ``alias_moved`` (false for a ``not-comparable`` candidate: registered as
a version, the alias left on the incumbent), and ``accuracy_base_solved`` / ``accuracy_base_unsolved``;
a registered version is tagged ``eval_accuracy``, ``eval_mean_reward``, ``eval_binary`` and
``eval_set_digest``, which is what the next candidate is compared with.
What it is not: the rule itself (``registry.py``), the run's artifacts (the flow logs them before), or
Prefect: the flow's ``tasks.finalize.finish_tracking`` calls this and logs the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollflow.api.config import ExperimentConfig
from rollflow.tracking.base_model import base_model_identity
from rollflow.tracking.mlflow_tracker import MlflowTracker
from rollflow.tracking.registry import Incumbent, decide_registration, incumbent_tags
from rollflow.trial.evaluations import eval_record
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

DECISION_TAG = "rollflow.registry.decision"
STAGE_TAG = "rollflow.registry.stage"  # registering | done
ALIAS_TAG = "rollflow.registry.alias_moved"  # false: registered without taking the alias (not comparable)
RETENTION = ("accuracy_base_solved", "accuracy_base_unsolved")


@dataclass(frozen=True)
class GateOutcome:
    """What the gate decided: the summary's ``registered_model`` / ``registry_decision`` and the tags."""

    registered_model: str | None  # "<model name> v<registry version>" when registered
    registry_decision: str  # the reason code, or "disabled"
    tags: dict[str, str]

    @property
    def decision(self) -> str:
        """``registered``, ``skipped`` or ``disabled``."""
        return self.tags[DECISION_TAG]

    @property
    def detail(self) -> str:
        return self.tags.get("rollflow.registry.detail", "")


def apply_registry_gate(
    cfg: ExperimentConfig,
    tracker: MlflowTracker,
    storage: Storage,
    *,
    final_version: int,
    steps_trained: int,
    eval_accuracy_after: float,
    eval_accuracy_before: float,
    source_model_version: str | None,
    lineage_tags: Callable[[], dict[str, str]],
) -> GateOutcome:
    """Decide, register when the gate passes, and tag the run with the decision (module docstring).
    ``lineage_tags()`` gives the run's lineage tags for the registered version (read only to register)."""
    if not cfg.tracking.register_model:
        tracker.set_tags({DECISION_TAG: "disabled"})
        return GateOutcome(None, "disabled", {DECISION_TAG: "disabled"})
    after = float(eval_accuracy_after)
    final = _eval_record(storage, final_version)
    before = _eval_record(storage, 0)
    eval_set = final.get("eval_set") or _digest_of(cfg)
    tags = _decided_before(tracker)
    if tags is None:
        tags = _decide(
            tracker, steps_trained, after, eval_accuracy_before, source_model_version, final, before
        )
        tags["rollflow.registry.eval_set"] = eval_set or "unknown"
        tags.update({f"rollflow.registry.{k}": f"{float(final[k]):.4f}" for k in RETENTION if k in final})
        if tags[DECISION_TAG] == "registered":  # written before registering: a resume finishes it
            decided = {k: v for k, v in tags.items() if k != DECISION_TAG}  # the decision tag comes last
            tracker.set_tags({**decided, STAGE_TAG: "registering"})
    registered = None
    if tags[DECISION_TAG] == "registered":
        store = CheckpointStore(storage)
        local = store.fetch(final_version, f"{cfg.storage.local_cache}/{cfg.experiment}/{cfg.trial}")
        version_tags = {
            "eval_accuracy": f"{after:.4f}",
            **({"eval_mean_reward": f"{float(final['mean_reward']):.4f}"} if "mean_reward" in final else {}),
            **({"eval_binary": str(bool(final["binary"])).lower()} if "binary" in final else {}),
            **({"eval_set_digest": eval_set} if eval_set else {}),
            **{k: f"{float(final[k]):.4f}" for k in RETENTION if k in final},
            "comparable": tags.get("rollflow.registry.comparable", "true"),
            "registry_reason": tags["rollflow.registry.reason"],
            "registry_detail": tags["rollflow.registry.detail"],
            **lineage_tags(),
        }
        move = tags.get(ALIAS_TAG, "true") != "false"
        if store.get(final_version).is_adapter:
            registry_version, merged = _register_lora(cfg, tracker, local, final_version, version_tags, move)
            if merged is not None:
                tags["rollflow.registry.merged_model"] = merged
        else:
            registry_version = tracker.register_checkpoint(
                local, version=final_version, extra_tags=version_tags, move_alias=move
            )
        registered = f"{tracker.model_name} v{registry_version}"
        tags["rollflow.registry.version"] = registry_version
        tags[STAGE_TAG] = "done"
    tracker.set_tags(tags)
    return GateOutcome(registered, tags["rollflow.registry.reason"], tags)


def _eval_record(storage: Storage, version: int) -> dict[str, Any]:
    """The trial's evaluation record of ``version`` ({} when there is none)."""
    return eval_record(storage, version) or {}


def _digest_of(cfg: ExperimentConfig) -> str | None:
    """The digest of the held-out rows ``cfg`` evaluates on, computed from the rows (no record of it)."""
    from rollflow.eval_scores import eval_set_digest
    from rollflow.evaluation import eval_prompts

    try:
        return eval_set_digest(eval_prompts(cfg))
    except Exception:  # noqa: BLE001 (data gone: the gate then cannot vouch for comparability)
        return None


def _decide(
    tracker: MlflowTracker,
    steps_trained: int,
    after: float,
    before: float,
    source_model_version: str | None,
    final: dict[str, Any],
    before_record: dict[str, Any],
) -> dict[str, str]:
    """The decision tags of ``decide_registration`` against the incumbent (re-scored by ``before`` when the
    run started from it). ``final`` / ``before_record``: the trial's evaluation records."""
    incumbent: Incumbent | None = tracker.registry.incumbent()
    if incumbent is not None and source_model_version == incumbent.version:
        # the run started from the incumbent: its "before" score is the incumbent on this eval set
        incumbent = incumbent.rescore(
            float(before), mean_reward=before_record.get("mean_reward"), binary=before_record.get("binary")
        )
    decision = decide_registration(
        steps_trained=steps_trained,
        eval_accuracy=after,
        incumbent=incumbent,
        mean_reward=final.get("mean_reward"),
        binary=bool(final.get("binary", True)),
        eval_set=final.get("eval_set") or None,
    )
    tags = {
        DECISION_TAG: "registered" if decision.register else "skipped",
        "rollflow.registry.reason": decision.reason,
        "rollflow.registry.detail": decision.detail,
        "rollflow.registry.metric": decision.metric,
        "rollflow.registry.comparable": "false" if decision.reason == "not-comparable" else "true",
        ALIAS_TAG: str(decision.register and decision.move_alias).lower(),
    }
    if incumbent is not None:
        tags.update(incumbent_tags(incumbent))
    return tags


def _decided_before(tracker: MlflowTracker) -> dict[str, str] | None:
    """The decision an earlier call wrote before it stopped half-way through registering, or None."""
    prior = tracker.run_tags()
    if prior.get(STAGE_TAG) != "registering":
        return None
    kept = {k: v for k, v in prior.items() if k.startswith("rollflow.registry.") and k != STAGE_TAG}
    return {**kept, DECISION_TAG: "registered"}


def _register_lora(
    cfg: ExperimentConfig,
    tracker: MlflowTracker,
    adapter_dir: Path,
    version: int,
    version_tags: dict[str, str],
    move_alias: bool = True,
) -> tuple[str, str | None]:
    """Register the adapter with its base's identity, then (``tracking.register_merged``) base + adapter
    merged under ``tracker.merged_model_name``, linked both ways; returns (the adapter's registry version,
    ``<name>-merged v<m>`` or None)."""
    base = base_model_identity(cfg.model.path)
    tags = {**version_tags, "lora_rank": str(cfg.train.lora.rank)}
    adapter_version = tracker.register_checkpoint(
        adapter_dir, version=version, extra_tags=tags, base=base, move_alias=move_alias
    )
    if not cfg.tracking.register_merged:
        return adapter_version, None
    from rollflow.training.lora import merge_adapter_dir

    merged_dir = merge_adapter_dir(
        str(base.local_dir), adapter_dir, adapter_dir.with_name(f"{adapter_dir.name}-merged")
    )
    merged_version = tracker.register_checkpoint(
        merged_dir,
        version=version,
        extra_tags={**tags, **base.tags()},
        merged_from=f"{tracker.model_name} v{adapter_version}",
        move_alias=move_alias,
    )
    merged = f"{tracker.merged_model_name} v{merged_version}"
    tracker.client.set_model_version_tag(tracker.model_name, adapter_version, "merged_model", merged)
    return adapter_version, merged
