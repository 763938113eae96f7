"""The registered policy as an MLflow chat model: called with messages, answered through the chat template.

What it is: ``log_chat_model`` writes a verified Hugging Face checkpoint directory as an MLflow 3 *logged
model* (``mlflow.search_logged_models`` finds it; it is linked to the run as an output, with the run's
metrics at ``step`` = the policy version) in the ``transformers`` flavour with MLflow's chat task
``llm/v1/chat``. Its signature takes OpenAI-style chat input, so both ways of calling it give the answer
the held-out evaluation scored:

    mlflow.pyfunc.load_model("models:/NAME/1").predict({"messages": [{"role": "user", "content": "12+14="}]})
    curl -d '{"messages": [{"role": "user", "content": "12+14="}]}' -H 'Content-Type: application/json' \\
        http://127.0.0.1:5001/invocations      # after `mlflow models serve -m models:/NAME/1 ...`

- the messages go through the tokenizer's chat template with the assistant turn opened
  (``apply_chat_template(..., add_generation_prompt=True)``), exactly the prompt the rollouts and the
  evaluation render (``rollflow.workflows.blocks.render_chat``); a raw prompt without the template is not
  what the policy was trained on;
- decoding is greedy (``do_sample=False``, as the held-out evaluation) up to ``max_new_tokens`` (the
  config's ``rollout.generation.max_new_tokens``; a request's ``max_tokens`` overrides it) and stops at
  the tokenizer's EOS; the reply is a ``chat.completion`` object (``choices[0].message.content``);
- the model card (``model_card.md`` / ``model_card_data.yaml``) says which trial and version it is and
  what it was trained from; the license is the base model's (``declared_license``).

A LoRA run's policy is its adapter (``adapter_model.safetensors`` + ``adapter_config.json``): given the
base's identity (``base_model.py``), ``log_chat_model`` logs it as a peft model in the same flavour and
task, as the logged model ``adapter`` (type ``rollflow-lora-adapter``). MLflow stores only the adapter
(``peft/``) and the tokenizer, and records the base's local directory (``local_base_model_path``):
``mlflow.transformers.load_model`` and ``mlflow.pyfunc.load_model`` read the base from there (or from
``base_model_path=``) and apply the adapter, and ``PeftModel.from_pretrained(base, <download>/peft)``
does the same by hand. The card and the logged model's tags name the base and its weights digest; a hub
base's revision also goes into the adapter's ``revision`` field, so peft reloads that commit.

Only the files a model needs are copied: rollflow's own bookkeeping (``.rollflow-*``, ``COMMIT.json``,
the bootstrap marker) stays out. What it is not: the registry gate or the model version and its alias
(``registry.py``), nor any check of the checkpoint (storage verified its checksums before this reads it).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollflow.tracking.base_model import BaseModelIdentity

CHAT_TASK = "llm/v1/chat"
MODEL_NAME = "model"  # the logged model's name (MLflow 3: ``name=``, not ``artifact_path=``)
MODEL_TYPE = "rollflow-policy"
ADAPTER_NAME = "adapter"  # the logged model's name for a LoRA run's adapter
ADAPTER_TYPE = "rollflow-lora-adapter"
_INTERNAL_PREFIXES = (".rollflow", ".")  # rollflow's markers and any hidden file
_INTERNAL_NAMES = {"COMMIT.json", "rollflow_bootstrap.json"}
_PIP_REQUIREMENTS = ["transformers", "torch", "safetensors", "tokenizers"]


@dataclass(frozen=True)
class LoggedChatModel:
    model_id: str  # ``m-...``: the MLflow 3 logged model
    model_uri: str  # ``models:/m-...``


@dataclass(frozen=True)
class PolicyCard:
    """What the model card says about a registered policy."""

    trial: str
    experiment: str
    version: int
    base_model: str  # the config's ``model.path``: a hub id or a local directory
    max_new_tokens: int
    eval_accuracy: str | None = None
    system_prompt: str | None = None  # the dataset's ``system_prompt``: training put it first
    lora_rank: int | None = None  # set for a LoRA adapter (``log_chat_model(..., base=...)``)
    merged_from: str | None = None  # ``<name> v<n>``: the registered adapter this model merges into its base
    registered_name: str | None = None  # the registry name: what a served reply's "model" field says


def model_files(src: Path) -> list[Path]:
    """The files of ``src`` a Hugging Face model needs (rollflow's bookkeeping left out)."""
    return [
        p
        for p in sorted(src.iterdir())
        if p.is_file() and not p.name.startswith(_INTERNAL_PREFIXES) and p.name not in _INTERNAL_NAMES
    ]


def declared_license(base_model: str) -> str:
    """The base model's license as its card declares it (``README.md`` front matter of a local directory);
    rollflow's own (Apache-2.0) for the tiny model rollflow bootstrapped; else ``other``, for which MLflow
    says it found no license information. For a hub id MLflow first fetches the repository's
    ``LICENSE`` file itself, when the hub can be reached."""
    base = Path(base_model)
    if (base / "rollflow_bootstrap.json").is_file():
        return "apache-2.0"
    readme = base / "README.md"
    if readme.is_file():
        from huggingface_hub import ModelCard

        try:
            value = ModelCard.load(readme).data.license
        except Exception:  # noqa: BLE001 (a card we cannot parse declares nothing)
            value = None
        if value:
            return str(value)
    return "other"


def model_card(card: PolicyCard, base: BaseModelIdentity | None = None) -> Any:
    """A ``huggingface_hub.ModelCard`` for the policy (MLflow writes it beside the model)."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(
        license=declared_license(card.base_model),
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["rollflow", "reinforcement-learning", "chat", *(["lora", "peft"] if card.lora_rank else [])],
    )
    accuracy = f"; held-out accuracy {card.eval_accuracy}" if card.eval_accuracy else ""
    system = (
        f"Training put this system message first: `{card.system_prompt}`.\n\n" if card.system_prompt else ""
    )
    text = (
        f"---\n{data.to_yaml()}\n---\n\n"
        f"# {card.experiment} policy, trial {card.trial}, version {card.version}\n\n"
        f"Trained with reinforcement learning by rollflow from `{card.base_model}`{accuracy}.\n\n"
        "Call it with chat messages; they go through the tokenizer's chat template, as in training, and\n"
        f"the answer is greedy, at most {card.max_new_tokens} new tokens:\n\n"
        '    {"messages": [{"role": "user", "content": "..."}]}\n\n'
        f"{system}{_lora_note(card, base)}License: the base model's (see its repository).\n"
    )
    return ModelCard(text)


def _lora_note(card: PolicyCard, base: BaseModelIdentity | None) -> str:
    """What the card says about an adapter's base, or about the adapter a merged model comes from."""
    if base is not None:
        revision = f", revision `{base.revision}`" if base.revision else ""
        return (
            f"This is a rank-{card.lora_rank} LoRA adapter (peft, in `peft/`), not a full model. Its base is\n"
            f"`{base.name}`{revision}, weights digest (blake3 of config.json and the weight files) `{base.blake3}`;\n"
            "`mlflow.transformers.load_model` reads the base from the recorded directory or from\n"
            "`base_model_path=`. Check the digest first: `rollflow.tracking.base_model.check_base_model`.\n\n"
        )
    if card.merged_from:
        return (
            f"The LoRA adapter registered as `{card.merged_from}`, merged into the base model's weights.\n\n"
        )
    return ""


def log_chat_model(
    client: Any,
    tracking_uri: str,
    run_id: str,
    checkpoint_dir: str | Path,
    card: PolicyCard,
    *,
    base: BaseModelIdentity | None = None,
) -> LoggedChatModel:
    """Log ``checkpoint_dir`` (a verified HF directory) as the run's chat model (module docstring); with
    ``base``, ``checkpoint_dir`` is a LoRA adapter of that base, logged as the model ``adapter``.

    The logged model is created in the run's experiment (MLflow's fluent default would file it under
    the experiment in the process's context, usually ``0``) and tagged with the trial and version.
    MLflow's model logging writes through the process-wide tracking URI: it is ``tracking_uri`` while
    this runs, and is put back after."""
    import mlflow

    experiment_id = client.get_run(run_id).info.experiment_id
    tags = {"rollflow.trial": card.trial, "rollflow.policy_version": str(card.version)}
    if base is not None:
        tags.update({f"rollflow.{k}": v for k, v in base.tags().items()})
    if card.merged_from:
        tags["rollflow.merged_from"] = card.merged_from
    logged = client.create_logged_model(
        experiment_id,
        name=MODEL_NAME if base is None else ADAPTER_NAME,
        source_run_id=run_id,
        model_type=MODEL_TYPE if base is None else ADAPTER_TYPE,
        tags=tags,
    )
    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        uri = _log_transformers(logged.model_id, run_id, Path(checkpoint_dir), card, base)
    finally:
        mlflow.set_tracking_uri(previous_uri)
    return LoggedChatModel(logged.model_id, uri)


def _log_transformers(
    model_id: str, run_id: str, checkpoint_dir: Path, card: PolicyCard, base: BaseModelIdentity | None
) -> str:
    """Write the model files (or the adapter, with ``base``) into the logged model ``model_id``; returns
    its URI."""
    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="rollflow-mlmodel-") as tmp:
        clean = Path(tmp) / "hf"
        clean.mkdir()
        for f in model_files(checkpoint_dir):
            shutil.copy2(f, clean / f.name)
        source = clean if base is None else base.local_dir
        model = AutoModelForCausalLM.from_pretrained(source, dtype="auto", trust_remote_code=False)
        # the name MLflow records as the source and a served reply's "model" field: the registered name
        # (else the base model), not a temp dir; the card carries the license, so no lookup goes out
        model.name_or_path = card.registered_name or card.base_model
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        extra: dict[str, Any] = {}
        if base is not None:  # MLflow keeps the adapter only and records base.local_dir
            model = _with_adapter(model, clean, base)
            extra["base_model_path"] = str(base.local_dir)
        info = mlflow.transformers.log_model(
            {"model": model, "tokenizer": tokenizer},
            name=MODEL_NAME if base is None else ADAPTER_NAME,
            model_id=model_id,
            run_id=run_id,
            step=card.version,
            task=CHAT_TASK,
            model_config={"do_sample": False, "max_new_tokens": card.max_new_tokens},
            model_card=model_card(card, base),
            pip_requirements=_PIP_REQUIREMENTS + (["peft"] if base is not None else []),
            **extra,
        )
    return str(info.model_uri)


def _with_adapter(model: Any, adapter_dir: Path, base: BaseModelIdentity) -> Any:
    """``model`` (the base) with the adapter of ``adapter_dir`` applied (peft), its config naming the
    base as configured and, for a hub base, the revision it was trained on."""
    import warnings

    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        peft_model = PeftModel.from_pretrained(model, adapter_dir)
    for cfg in peft_model.peft_config.values():
        cfg.base_model_name_or_path = base.name
        cfg.revision = base.revision
    return peft_model
