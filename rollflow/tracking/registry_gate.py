"""The registry gate at the end of a trial: decide whether the final policy enters the registry, and do it.

What it is: ``apply_registry_gate`` runs the rule of ``rollflow.tracking.registry.decide_registration``
on a finished trial (it trained, and its held-out accuracy is at least the incumbent's; an incumbent the
run started from is re-scored by the run's "before" evaluation), records the decision on the trial's
MLflow run as tags (``rollflow.registry.decision`` / ``reason`` / ``detail``, and the incumbent's), and
when the gate lets it, fetches the final checkpoint (verified), merges a LoRA adapter into its base, and
registers it with its lineage. ``tracking.register_model: false`` records ``disabled`` and registers
nothing.
What it is not: the rule itself (``registry.py``), the run's artifacts (the flow logs them before), or
Prefect: the flow's ``tasks.finalize.finish_tracking`` calls this and logs the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollflow.api.config import ExperimentConfig
from rollflow.tracking.mlflow_tracker import MlflowTracker
from rollflow.tracking.registry import decide_registration, incumbent_tags
from storage.checkpoints import CheckpointStore
from storage.fs import Storage

DECISION_TAG = "rollflow.registry.decision"


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
    incumbent = tracker.registry.incumbent()
    if incumbent is not None and source_model_version == incumbent.version:
        # the run started from the incumbent: its "before" score is the incumbent on this eval set
        incumbent = incumbent.rescore(float(eval_accuracy_before))
    decision = decide_registration(steps_trained=steps_trained, eval_accuracy=after, incumbent=incumbent)
    tags = {
        DECISION_TAG: "registered" if decision.register else "skipped",
        "rollflow.registry.reason": decision.reason,
        "rollflow.registry.detail": decision.detail,
    }
    if incumbent is not None:
        tags.update(incumbent_tags(incumbent))
    registered = None
    if decision.register:
        store = CheckpointStore(storage)
        local = store.fetch(final_version, f"{cfg.storage.local_cache}/{cfg.experiment}/{cfg.trial}")
        version_tags = {
            "eval_accuracy": f"{after:.4f}",
            "registry_reason": decision.reason,
            "registry_detail": decision.detail,
            **lineage_tags(),
        }
        if store.get(final_version).is_adapter:  # LoRA: register base + adapter, merged
            from rollflow.training.lora import merge_adapter_dir

            local = merge_adapter_dir(cfg.model.path, local, local.with_name(f"{local.name}-merged"))
            version_tags.update(lora_rank=str(cfg.train.lora.rank), lora_base_model=cfg.model.path)
        registry_version = tracker.register_checkpoint(local, version=final_version, extra_tags=version_tags)
        tags["rollflow.registry.version"] = registry_version
        registered = f"{tracker.model_name} v{registry_version}"
    tracker.set_tags(tags)
    return GateOutcome(registered, decision.reason, tags)
