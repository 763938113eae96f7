"""Publishing policy checkpoints, in version order, optionally overlapped with the next training step.

What it is: ``CheckpointPublisher``. The trainer hands it a full CPU state dict (a snapshot, already
copied out of the live parameters) and a version; a worker thread writes a Hugging Face directory
(config.json, generation_config.json, tokenizer files, safetensors shards) and calls
``CheckpointStore.publish`` (files, then COMMIT.json, then LATEST). At most one publish is in flight:
submitting version N+1 first waits for N, so versions are published in order and a failure surfaces at
the next ``submit`` or ``flush`` as a TrainerError.

Monotonic versions across restarts: ``floor`` is the newest version already in storage when the
trainer starts; versions <= floor are skipped (a restarted trainer that replays steps since its last
resume point does not re-publish them with different weights).

With LoRA (``adapter_config`` given) a version is the adapter alone: ``adapter_model.safetensors`` (the
lora_A / lora_B tensors, hashed while written) and ``adapter_config.json``, published through the same
``CheckpointStore.publish`` (COMMIT.json with sizes + digests, LATEST, acks, GC) as a full checkpoint.

What it is not: model gathering (``distributed.full_model_state_dict``) or checkpoint GC policy (it only
calls ``CheckpointStore.gc`` with the configured ``keep_last``).

Hash while writing: the safetensors files (and the shard index) are written here from the tensors'
own memory, and each file's digest is computed from those same buffers as they are written (in a
helper thread), never by reading the file back. The digests go to ``publish``, which then only hashes
the few small files transformers writes itself (config, generation config, tokenizer).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rollflow.api.errors import TrainerError
from rollflow.api.stores import CheckpointSink
from storage.checkpoints import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from storage.transfer import FileDigest, hash_file, write_hashed

logger = logging.getLogger(__name__)

MAX_SHARD_SIZE = "5GB"


def tied_aliases(model: torch.nn.Module) -> set[str]:
    """Names of parameters that alias an earlier one (tied lm_head): dropped from saved weights, as HF does."""
    seen: dict[int, str] = {}
    aliases: set[str] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        else:
            seen[id(p)] = name
    return aliases


# safetensors dtype names (the format's spec); anything else is written by safetensors itself.
_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}  # fmt: skip


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], *, metadata: dict[str, str], hash_algo: str | None
) -> FileDigest | None:
    """Write a safetensors file straight from the tensors' memory; returns its digest (``hash_algo``).

    The layout is the format's: an 8-byte little-endian header length, the JSON header (padded with
    spaces to 8 bytes) naming each tensor's dtype, shape and byte range, then the raw little-endian
    bytes. Tensors go largest element size first, so every tensor starts aligned to its element size.
    The digest is computed from the buffers being written (``storage.transfer.write_hashed``).
    Tensors of a dtype not in ``_ST_DTYPES`` fall back to ``safetensors.save_file`` + hashing the file.
    """
    if any(t.dtype not in _ST_DTYPES for t in tensors.values()):
        save_file(tensors, str(path), metadata=metadata)
        return hash_file(path, hash_algo) if hash_algo else None
    header: dict[str, Any] = {"__metadata__": metadata}
    buffers: list[Any] = []
    offset = 0
    for name, t in sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0])):
        t = t.detach().cpu().contiguous()
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
        buffers.append(t.reshape(-1).view(torch.uint8).numpy())  # [nbytes], shares the tensor's memory
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    parts = [len(head).to_bytes(8, "little"), head, *buffers]
    with open(path, "wb", buffering=0) as f:
        if hash_algo is not None:
            return write_hashed(f, parts, hash_algo)
        for p in parts:
            f.write(p)
    return None


def write_hf_dir(
    out_dir: Path,
    state_dict: dict[str, torch.Tensor],
    *,
    config: Any,
    tokenizer: Any | None,
    generation_config: Any | None = None,
    dtype: torch.dtype = torch.float32,
    architecture: str | None = None,
    hash_algo: str | None = None,
) -> dict[str, FileDigest]:
    """A ``from_pretrained``-loadable directory from a state dict, without touching a live model.

    Returns the digests (``hash_algo``; empty if None) of the weight files and the shard index, computed
    while writing them; the config and tokenizer files are left to the caller to hash.
    """
    from huggingface_hub import split_torch_state_dict_into_shards

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(config)
    cfg.dtype = dtype
    if architecture:
        cfg.architectures = [architecture]
    cfg.save_pretrained(out_dir)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state_dict.items()}
    split = split_torch_state_dict_into_shards(sd, max_shard_size=MAX_SHARD_SIZE)
    digests: dict[str, FileDigest] = {}
    for filename, names in split.filename_to_tensors.items():
        d = write_safetensors(
            out_dir / filename, {n: sd[n] for n in names}, metadata={"format": "pt"}, hash_algo=hash_algo
        )
        if d is not None:
            digests[filename] = d
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        data = json.dumps(index, indent=2, sort_keys=True).encode()
        with open(out_dir / "model.safetensors.index.json", "wb") as f:
            if hash_algo is not None:
                digests["model.safetensors.index.json"] = write_hashed(f, [data], hash_algo)
            else:
                f.write(data)
    return digests


def write_adapter_dir(
    out_dir: Path,
    tensors: dict[str, torch.Tensor],
    *,
    adapter_config: dict[str, Any],
    dtype: torch.dtype = torch.float32,
    hash_algo: str | None = None,
) -> dict[str, FileDigest]:
    """A ``PeftModel.from_pretrained``-loadable adapter directory; returns the weight file's digest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ADAPTER_CONFIG_NAME).write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
    sd = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    d = write_safetensors(out_dir / ADAPTER_WEIGHTS_NAME, sd, metadata={"format": "pt"}, hash_algo=hash_algo)
    return {ADAPTER_WEIGHTS_NAME: d} if d is not None else {}


class CheckpointPublisher:
    """Publishes versions in order; ``background=True`` overlaps each upload with the next step.

    ``adapter_config``: publish LoRA adapters (the state dicts handed to ``submit`` hold only the
    adapter's tensors, ``lora.adapter_tensors``) instead of full Hugging Face directories.
    """

    def __init__(
        self,
        store: CheckpointSink,
        *,
        config: Any,
        tokenizer: Any | None,
        generation_config: Any | None = None,
        architecture: str | None = None,
        dtype: torch.dtype = torch.float32,
        floor: int = -1,
        background: bool = True,
        keep_last: int | None = None,
        adapter_config: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.adapter_config = adapter_config
        self.config = config
        self.tokenizer = tokenizer
        self.generation_config = generation_config
        self.architecture = architecture
        self.dtype = dtype
        self.floor = floor
        self.background = background
        self.keep_last = keep_last
        self.published: list[int] = []
        self.last_publish_s = 0.0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self,
        version: int,
        state_dict: dict[str, torch.Tensor],
        *,
        step: int,
        meta: dict[str, Any] | None = None,
    ) -> bool:
        """Publish ``version`` (after the previous one finished). False if it is <= floor (skipped)."""
        if version <= self.floor:
            logger.info(  # once per replayed step after a resume: part of the resume's story
                "not publishing v%d: storage already has v%d (replayed step after restart)",
                version,
                self.floor,
            )
            return False
        self.flush()
        self.floor = version
        args = (version, state_dict, step, dict(meta or {}))
        if self.background:
            self._thread = threading.Thread(
                target=self._run, args=args, name=f"publish-v{version}", daemon=True
            )
            self._thread.start()
        else:
            self._run(*args)
            self._raise()
        return True

    def flush(self) -> None:
        """Wait for the in-flight publish; raise TrainerError if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise TrainerError(f"publishing a checkpoint failed: {err}") from err

    def _run(
        self, version: int, state_dict: dict[str, torch.Tensor], step: int, meta: dict[str, Any]
    ) -> None:
        t0 = time.perf_counter()
        tmp: Path | None = None
        try:
            staging = self.store.staging_dir(version)
            if staging is None:
                tmp = Path(tempfile.mkdtemp(prefix=f"rollflow-ckpt-v{version}-"))
            out = staging if staging is not None else tmp
            assert out is not None
            algo = self.store.hash_algo
            if self.adapter_config is not None:
                digests = write_adapter_dir(
                    out, state_dict, adapter_config=self.adapter_config, dtype=self.dtype, hash_algo=algo
                )
            else:
                digests = write_hf_dir(
                    out,
                    state_dict,
                    config=self.config,
                    tokenizer=self.tokenizer,
                    generation_config=self.generation_config,
                    dtype=self.dtype,
                    architecture=self.architecture,
                    hash_algo=algo,
                )
            if algo is None:
                self.store.publish(out, version, step=step, meta=meta)
            else:  # the store trusts these digests: the files are not read again
                self.store.publish(out, version, step=step, meta=meta, digests=digests)
            self.published.append(version)
            if self.keep_last:
                self.store.gc(self.keep_last)
            self.last_publish_s = time.perf_counter() - t0
            logger.debug("published checkpoint v%d in %.2fs", version, self.last_publish_s)
        except BaseException as e:  # surfaced by the next submit/flush on the training thread
            logger.error("publishing checkpoint v%d failed: %s", version, e)
            self._error = e
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
