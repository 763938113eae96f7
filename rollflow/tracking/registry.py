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

  Two refinements, for scores that cannot be compared as they stand:
  * **the same evaluation set.** A candidate scored on held-out rows whose digest
    (``rollflow.eval_scores.eval_set_digest``) differs from the incumbent's ``eval_set_digest`` tag (or an
    incumbent registered without one) is ``not-comparable``: it is registered as a new version of the
    model, tagged ``comparable=false``, but the alias stays where it is (``RegistryDecision.move_alias``
    is False). Every candidate stays in the registry, as MLflow users expect, and the champion changes
    only on evidence. A retrain re-scores its incumbent on its own set, so it is always comparable.
  * **what "better" means.** Accuracy counts rewards ``>= eval.correct_reward``; when either side's
    rewards were not binary (partial credit), accuracy would tie at 0, so the mean reward is compared
    instead (``RegistryDecision.metric``).
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
    mean_reward: float | None = None  # eval mean reward (tag eval_mean_reward; the before score if re-scored)
    binary: bool | None = None  # its eval rewards were all 0 or correct (tag eval_binary); None = not known
    eval_set: str | None = None  # digest of the held-out rows it was scored on (tag eval_set_digest)

    def rescore(
        self, eval_accuracy: float, *, mean_reward: float | None = None, binary: bool | None = None
    ) -> Incumbent:
        """This incumbent judged by ``eval_accuracy`` (its score on this run's held-out prompts)."""
        return Incumbent(
            self.version, eval_accuracy, self.tags, True, self.eval_accuracy, mean_reward, binary, None
        )

    def score(self, metric: str) -> float | None:
        return self.mean_reward if metric == "mean_reward" else self.eval_accuracy

    def describe(self, metric: str = "accuracy") -> str:
        """``incumbent v1 0.9950`` (+ how that number came about when it was re-scored)."""
        value = self.score(metric)
        what = "" if metric == "accuracy" else "mean reward "
        acc = f"(no recorded {metric.replace('_', ' ')})" if value is None else f"{what}{value:.4f}"
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
    reason: str  # first-version | eval-improved | eval-tied | eval-worse | no-training | not-comparable
    detail: str  # one human sentence, stored as a tag
    move_alias: bool = True  # False: registered as a version, the alias stays on the incumbent
    metric: str = "accuracy"  # accuracy | mean_reward: what was compared


def incumbent_tags(incumbent: Incumbent) -> dict[str, str]:
    """Run tags that say what the candidate was compared with (``rollflow.registry.incumbent_*``)."""
    tags = {"rollflow.registry.incumbent_version": incumbent.version}
    if incumbent.eval_accuracy is not None:
        tags["rollflow.registry.incumbent_accuracy"] = f"{incumbent.eval_accuracy:.4f}"
    if incumbent.mean_reward is not None:
        tags["rollflow.registry.incumbent_mean_reward"] = f"{incumbent.mean_reward:.4f}"
    if incumbent.eval_set is not None:
        tags["rollflow.registry.incumbent_eval_set"] = incumbent.eval_set
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
    *,
    steps_trained: int,
    eval_accuracy: float,
    incumbent: Incumbent | None,
    mean_reward: float | None = None,
    binary: bool = True,
    eval_set: str | None = None,
) -> RegistryDecision:
    """See the module docstring. An incumbent without a recorded score counts as beaten. ``eval_set``:
    the digest of the candidate's held-out rows (None: not known, no check); ``binary`` / ``mean_reward``:
    whether its rewards were binary, and their mean."""
    if steps_trained <= 0:
        return RegistryDecision(False, "no-training", "the run trained 0 steps; nothing new to register")
    if incumbent is None:
        return RegistryDecision(True, "first-version", f"no incumbent; eval accuracy {eval_accuracy:.4f}")
    if eval_set is not None and not incumbent.rescored and incumbent.eval_set != eval_set:
        seen = incumbent.eval_set or "no recorded evaluation set"
        return RegistryDecision(
            True,
            "not-comparable",
            f"scored on evaluation set {eval_set[:19]}, {incumbent.describe()} on {seen[:19]}: not comparable; "
            "registered as a new version, the alias stays on the incumbent",
            move_alias=False,
        )
    metric = (
        "mean_reward" if (not binary or incumbent.binary is False) and mean_reward is not None else "accuracy"
    )
    value = mean_reward if metric == "mean_reward" else eval_accuracy
    assert value is not None
    what = "eval accuracy" if metric == "accuracy" else "eval mean reward (partial-credit rewards)"
    best = incumbent.score(metric)
    if best is None or value > best:
        return RegistryDecision(
            True, "eval-improved", f"{what} {value:.4f} > {incumbent.describe(metric)}", metric=metric
        )
    if value == best:
        return RegistryDecision(
            True, "eval-tied", f"{what} {value:.4f} = {incumbent.describe(metric)}", metric=metric
        )
    return RegistryDecision(
        False,
        "eval-worse",
        f"{what} {value:.4f} < {incumbent.describe(metric)}; registry unchanged",
        metric=metric,
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
        acc, mean, binary = tags.get("eval_accuracy"), tags.get("eval_mean_reward"), tags.get("eval_binary")
        return Incumbent(
            str(mv.version),
            float(acc) if acc not in (None, "") else None,
            tags,
            mean_reward=float(mean) if mean not in (None, "") else None,
            binary=None if binary is None else binary == "true",
            eval_set=tags.get("eval_set_digest") or None,
        )

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

    def register(
        self,
        run_id: str,
        model: LoggedChatModel,
        *,
        tags: dict[str, str],
        description: str,
        move_alias: bool = True,
    ) -> str:
        """Create a model version of the logged ``model`` (``models:/m-...``, made by ``run_id``) and point
        the alias at it (unless ``move_alias`` is False: a candidate that is not comparable)."""
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
        if move_alias:
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
