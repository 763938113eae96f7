"""The CPU server's weight load (``infra/cpu_server/weights.py``) in-process, without HTTP.

The served weights must not depend on the checkpoint file after the load (the watcher may hand over the
store's own directory), the finiteness check must catch NaN and both infinities, and a checkpoint in
another dtype is cast to the served one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from infra.cpu_server.weights import WeightLoadError, load_checked_weights, read_config, swap_weights_in_place


def _served(model_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict[str, Any]]:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval(), read_config(model_dir)


def test_loaded_weights_do_not_follow_later_changes_to_the_file(
    tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir_b, ck)
    model, cfg = _served(tiny_model_dir)
    want = {k: v.clone() for k, v in load_file(ck / "model.safetensors").items()}
    tensors = load_checked_weights(model, cfg, str(ck))
    swap_weights_in_place(model, tensors)
    path = ck / "model.safetensors"
    with open(path, "r+b") as f:  # rewrite every data byte in place (same inode, same size)
        head = 8 + int.from_bytes(f.read(8), "little")
        f.seek(head)
        f.write(b"\x7f" * (path.stat().st_size - head))
    for name, p in model.named_parameters():
        assert torch.equal(p, want[name]), name  # still the bytes that were loaded


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_refused(tiny_model_dir: Path, tmp_path: Path, bad: float) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir, ck)
    tensors = load_file(ck / "model.safetensors")
    w = tensors["model.layers.1.mlp.down_proj.weight"]
    w[w.shape[0] // 2, 3] = bad  # somewhere in the middle, not the first element
    save_file(tensors, ck / "model.safetensors", metadata={"format": "pt"})
    model, cfg = _served(tiny_model_dir)
    with pytest.raises(WeightLoadError, match="down_proj.weight' has NaN or inf"):
        load_checked_weights(model, cfg, str(ck))


def test_a_bf16_checkpoint_is_cast_to_the_served_dtype(tiny_model_dir: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir, ck)
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(ck / "model.safetensors").items()}
    save_file(tensors, ck / "model.safetensors", metadata={"format": "pt"})
    cfg_path = ck / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "dtype": "bfloat16"}))
    model, cfg = _served(tiny_model_dir)
    out = load_checked_weights(model, cfg, str(ck))
    assert {t.dtype for t in out.values()} == {torch.float32}
    name = "model.norm.weight"
    assert torch.equal(out[name], tensors[name].to(torch.float32))


def _commit(ck: Path) -> dict[str, Any]:
    from storage.transfer import hash_file

    files = {
        p.name: {"size": p.stat().st_size, "blake3": hash_file(p, "blake3").digest} for p in ck.iterdir()
    }
    return {"hash": "blake3", "files": files}


def test_with_commit_a_changed_weight_byte_is_refused_and_nothing_loads(
    tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(tiny_model_dir_b, ck)
    commit = _commit(ck)
    model, cfg = _served(tiny_model_dir)
    tensors = load_checked_weights(model, cfg, str(ck), commit=commit)  # the bytes COMMIT.json names: loads
    assert torch.equal(tensors["model.norm.weight"], load_file(ck / "model.safetensors")["model.norm.weight"])
    path = ck / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # same size, other digest
    path.write_bytes(bytes(data))
    with pytest.raises(WeightLoadError, match="model.safetensors.*blake3.*COMMIT.json"):
        load_checked_weights(model, cfg, str(ck), commit=commit)
    with pytest.raises(WeightLoadError, match="config.json.*not in COMMIT.json"):
        load_checked_weights(model, cfg, str(ck), commit={"hash": "blake3", "files": {}})
