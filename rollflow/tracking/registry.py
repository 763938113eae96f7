"""The MLflow model registry for rollflow policies: the gate, the model format and the download.

What it is:
- ``decide_registration``: a pure rule that says whether a finished run's policy enters the registry.
  A run registers only when it trained (``steps_trained > 0``) and, when an incumbent exists (the
  version under the ``latest-rl`` alias), only when its held-out accuracy is at least the incumbent's:
  ``register = steps_trained > 0 and (incumbent is None or acc >= acc_incumbent)``. The reason is kept
  as a short code (``first-version``, ``eval-improved``, ``eval-tied``, ``eval-worse``, ``no-training``)
  so it can be stored as a tag. When the run started from the incumbent (a retrain), the incumbent is
  re-scored on this run's held-out prompts (its "before" evaluation) rather than judged by the score it
  was registered with (``Incumbent.rescored``); the detail then says so and gives both numbers, e.g.
  ``eval accuracy 0.9850 < incumbent v1 0.9950 (re-scored on this run's eval prompts; registered with
  0.9900)``, and ``incumbent_tags`` gives the same as separate tags.
- the model format is ``chat_model.py``'s: an MLflow 3 logged model in the transformers flavour with the
  chat task, called with ``{"messages": [...]}`` (``mlflow.pyfunc``, ``mlflow models serve``).
- ``Registry``: find the incumbent, register a logged model with tags (the version's source is the logged
  model, ``models:/m-...``), move the alias, and download a registered version back as one Hugging Face
  directory (for a retrain). A registered LoRA adapter comes back merged into its base, read from the
  directory MLflow recorded once its weights digest matches the version's (``base_model.py``).
What it is not: the run's params/metrics (``mlflow_tracker``) or the place a checkpoint is verified
(storage verifies checksums before anything here reads the files).
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollflow.tracking.chat_model import LoggedChatModel, model_files

ALIAS = "latest-rl"


@dataclass(frozen=True)
class Incumbent:
    """The registered version the alias points at and the held-out accuracy the gate compares with: the
    one it was registered with or, once ``rescore``d, its score on this run's prompts."""

    version: str
    eval_accuracy: float | None
    tags: dict[str, str]
    rescored: bool = False
    registered_accuracy: float | None = None  # what it was registered with, kept when it is re-scored

    def rescore(self, eval_accuracy: float) -> Incumbent:
        """This incumbent judged by ``eval_accuracy`` (its score on this run's held-out prompts)."""
        return Incumbent(self.version, eval_accuracy, self.tags, True, self.eval_accuracy)

    def describe(self) -> str:
        """``incumbent v1 0.9950`` (+ how that number came about when it was re-scored)."""
        acc = "(no recorded accuracy)" if self.eval_accuracy is None else f"{self.eval_accuracy:.4f}"
        if not self.rescored:
            return f"incumbent v{self.version} {acc}"
        return f"incumbent v{self.version} {acc} (re-scored on this run's eval prompts; {self._registered()})"

    def _registered(self) -> str:
        if self.registered_accuracy is None:
            return "registered without a score"
        return f"registered with {self.registered_accuracy:.4f}"


@dataclass(frozen=True)
class RegistryDecision:
    register: bool
    reason: str  # first-version | eval-improved | eval-tied | eval-worse | no-training
    detail: str  # one human sentence, stored as a tag


def incumbent_tags(incumbent: Incumbent) -> dict[str, str]:
    """Run tags that say what the candidate was compared with (``rollflow.registry.incumbent_*``)."""
    tags = {"rollflow.registry.incumbent_version": incumbent.version}
    if incumbent.eval_accuracy is not None:
        tags["rollflow.registry.incumbent_accuracy"] = f"{incumbent.eval_accuracy:.4f}"
    if incumbent.rescored:
        tags["rollflow.registry.incumbent_rescored"] = "true"
        if incumbent.registered_accuracy is not None:
            tags["rollflow.registry.incumbent_registered_accuracy"] = f"{incumbent.registered_accuracy:.4f}"
        tags["rollflow.registry.incumbent_note"] = (
            f"v{incumbent.version} was re-scored on this run's held-out prompts (the run started from it): "
            f"{incumbent.eval_accuracy:.4f}; {incumbent._registered()}"
        )
    return tags


def decide_registration(
    *, steps_trained: int, eval_accuracy: float, incumbent: Incumbent | None
) -> RegistryDecision:
    """See the module docstring. An incumbent without a recorded accuracy counts as beaten."""
    if steps_trained <= 0:
        return RegistryDecision(False, "no-training", "the run trained 0 steps; nothing new to register")
    if incumbent is None:
        return RegistryDecision(True, "first-version", f"no incumbent; eval accuracy {eval_accuracy:.4f}")
    best = incumbent.eval_accuracy
    if best is None or eval_accuracy > best:
        return RegistryDecision(
            True, "eval-improved", f"eval accuracy {eval_accuracy:.4f} > {incumbent.describe()}"
        )
    if eval_accuracy == best:
        return RegistryDecision(
            True, "eval-tied", f"eval accuracy {eval_accuracy:.4f} = {incumbent.describe()}"
        )
    return RegistryDecision(
        False,
        "eval-worse",
        f"eval accuracy {eval_accuracy:.4f} < {incumbent.describe()}; registry unchanged",
    )


class Registry:
    """One registered model name in one MLflow tracking store."""

    def __init__(self, client: Any, model_name: str) -> None:
        self.client = client
        self.model_name = model_name

    def incumbent(self) -> Incumbent | None:
        from mlflow.exceptions import MlflowException

        try:
            mv = self.client.get_model_version_by_alias(self.model_name, ALIAS)
        except MlflowException:
            return None  # no registered model, or no alias yet
        tags = dict(mv.tags)
        acc = tags.get("eval_accuracy")
        return Incumbent(str(mv.version), float(acc) if acc not in (None, "") else None, tags)

    def registered_by(self, run_id: str, policy_version: int) -> str | None:
        """The version of this model that run ``run_id`` already registered for ``policy_version``, if any:
        what makes registering idempotent when a finalize that stopped half-way is resumed."""
        from mlflow.exceptions import MlflowException

        try:
            found = self.client.search_model_versions(f"name='{self.model_name}' and run_id='{run_id}'")
        except MlflowException:
            return None  # no registered model of that name yet
        mine = [mv for mv in found if mv.tags.get("policy_version") == str(policy_version)]
        return str(min(int(mv.version) for mv in mine)) if mine else None

    def point_alias(self, version: str) -> None:
        self.client.set_registered_model_alias(self.model_name, ALIAS, version)

    def register(self, run_id: str, model: LoggedChatModel, *, tags: dict[str, str], description: str) -> str:
        """Create a model version of the logged ``model`` (``models:/m-...``, made by ``run_id``) and point
        the alias at it."""
        from mlflow.exceptions import MlflowException

        with contextlib.suppress(MlflowException):  # already exists
            self.client.create_registered_model(self.model_name)
        mv = self.client.create_model_version(
            self.model_name,
            source=model.model_uri,
            run_id=run_id,
            model_id=model.model_id,
            tags=tags,
            description=description,
        )
        self.point_alias(str(mv.version))
        return str(mv.version)

    def download(self, dst: str | Path, tracking_uri: str) -> tuple[Path, Incumbent]:
        """Download the alias's version and assemble one HF directory (weights + tokenizer) under ``dst``."""
        import mlflow

        inc = self.incumbent()
        if inc is None:
            raise LookupError(
                f"no version of {self.model_name!r} carries the alias {ALIAS!r} at {tracking_uri}; run a "
                "training flow first or set model.path to a checkpoint"
            )
        dst = Path(dst)
        dst.mkdir(parents=True, exist_ok=True)
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"models:/{self.model_name}/{inc.version}",
                dst_path=str(dst / "mlmodel"),
                tracking_uri=tracking_uri,
            )
        )
        hf = dst / "hf"
        if (local / "peft").is_dir():  # a LoRA adapter: base + adapter, merged
            return _merge_registered_adapter(local, hf, f"{self.model_name} v{inc.version}", inc.tags), inc
        if hf.exists():
            shutil.rmtree(hf)
        hf.mkdir()
        for sub in (local / "model", local / "components" / "tokenizer"):
            for f in model_files(sub) if sub.is_dir() else []:
                shutil.copy2(f, hf / f.name)
        if not (hf / "config.json").exists():
            raise LookupError(f"{self.model_name} v{inc.version} is not a transformers-flavour model")
        return hf, inc


def _merge_registered_adapter(mlmodel: Path, hf: Path, what: str, tags: dict[str, str]) -> Path:
    """``hf``: the registered adapter in ``mlmodel`` (``peft/``) merged into its base, which must be where
    MLflow recorded it and have the weights digest the version was registered with."""
    import yaml

    from rollflow.tracking.base_model import DIGEST_TAG, NAME_TAG, check_base_model
    from rollflow.training.lora import merge_adapter_dir

    flavor = yaml.safe_load((mlmodel / "MLmodel").read_text())["flavors"]["transformers"]
    base = flavor.get("local_base_model_path")
    if not base or not Path(base).is_dir() or DIGEST_TAG not in tags:
        raise LookupError(
            f"{what} is a LoRA adapter of {tags.get(NAME_TAG, flavor.get('source_model_name'))!r}, but its base "
            f"model is not at the recorded directory {base!r} (or the version has no {DIGEST_TAG} tag); put the "
            "base model there, or start from a full model with model.path"
        )
    check_base_model(base, tags[DIGEST_TAG], what=what)
    return merge_adapter_dir(base, mlmodel / "peft", hf)
