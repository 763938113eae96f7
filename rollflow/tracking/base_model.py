"""The identity of a LoRA adapter's base model: its name, its revision and a digest of its weights.

What it is: a registered adapter is useless without the exact base it was trained on, so the registry
records, beside the adapter, enough for a user to find that base and to check it before applying the
adapter:

- ``name``: the config's ``model.path`` as written (a Hugging Face hub id or a local directory); it is
  also the adapter's ``base_model_name_or_path``;
- ``revision``: for a hub id, the commit of the snapshot the process read (the Hugging Face cache's
  ``snapshots/<commit>``), which peft's ``revision`` field and ``from_pretrained(revision=...)`` take;
  None for a local directory;
- ``blake3``: one digest over the base's ``config.json`` and weight files (``*.safetensors``,
  ``*.bin``), each hashed with blake3 (``storage.transfer.hash_file``) and combined as

      blake3("".join(f"{file}\\t{size}\\t{blake3(file)}\\n" for file in sorted(files)))

  so the same bytes under the same file names give the same digest on any machine, whatever the
  directory is called (a hub snapshot or a copy of it);
- ``local_dir``: where this process read it (what MLflow's ``base_model_path`` records).

``check_base_model`` recomputes the digest of a directory and raises ``BaseModelMismatchError`` unless
it equals the registered one: run it before loading a base for the adapter.

What it is not: a downloader (a hub base not in the local cache is an error saying so) or the logging of
the adapter (``chat_model.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollflow.api.errors import BaseModelMismatchError, ConfigError

DIGEST_TAG = "lora_base_model_blake3"
NAME_TAG = "lora_base_model"
REVISION_TAG = "lora_base_model_revision"
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class BaseModelIdentity:
    name: str  # model.path as configured: hub id or local directory
    local_dir: Path  # where this process read it
    blake3: str  # weights_digest(local_dir)
    revision: str | None = None  # the hub commit (None for a local directory)

    def tags(self) -> dict[str, str]:
        """Model-version tags: ``lora_base_model``, ``lora_base_model_blake3`` (+ ``..._revision``)."""
        tags = {NAME_TAG: self.name, DIGEST_TAG: self.blake3}
        if self.revision:
            tags[REVISION_TAG] = self.revision
        return tags


def weights_digest(model_dir: str | Path) -> str:
    """The combined blake3 digest of a model directory's ``config.json`` and weight files (docstring)."""
    from storage.transfer import hash_file, new_hasher

    root = Path(model_dir)
    files = sorted(
        p for p in root.iterdir() if p.is_file() and (p.name == "config.json" or p.suffix in _WEIGHT_SUFFIXES)
    )
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"{root} holds no weight files (*.safetensors, *.bin): not a model directory")
    h = new_hasher("blake3")
    for p in files:
        d = hash_file(p, "blake3")
        h.update(f"{p.name}\t{d.size}\t{d.digest}\n".encode())
    return h.hexdigest()


def base_model_identity(model_path: str) -> BaseModelIdentity:
    """The identity of ``model_path`` (a local directory, else a hub id found in the local HF cache)."""
    local = Path(model_path)
    if local.is_dir():
        return BaseModelIdentity(model_path, local.resolve(), weights_digest(local))
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(model_path, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 (not cached, or not a repo id: both mean "not here")
        raise ConfigError(
            "model.path",
            f"{model_path!r} is neither a local directory nor a model in this process's Hugging Face cache "
            f"({type(exc).__name__}); the registry records the base model's weights digest, so the process "
            "that registers a LoRA adapter must be able to read the base it was trained on",
        ) from exc
    return BaseModelIdentity(model_path, snapshot, weights_digest(snapshot), revision=snapshot.name)


def check_base_model(model_dir: str | Path, expected_blake3: str, *, what: str) -> None:
    """BaseModelMismatchError unless ``model_dir``'s weights digest is ``expected_blake3``."""
    got = weights_digest(model_dir)
    if got != expected_blake3:
        raise BaseModelMismatchError(
            f"{what} was trained on a base model with weights digest {expected_blake3} "
            f"(tag {DIGEST_TAG}), but {model_dir} has {got}: point it at the base model the adapter was "
            f"trained on (tags {NAME_TAG} / {REVISION_TAG})"
        )
