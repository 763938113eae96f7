"""Which files the CPU server's loaders may open: every path is checked after resolution.

In-process, no HTTP (``infra/cpu_server/weights.py`` and ``adapters.py``). A sharded index whose
``weight_map`` names an absolute or ``../`` shard, and a ``model.safetensors`` symlink leaving the
checkpoint, are refused before anything outside is opened, with the same message whether the outside
file exists or not. Shards and symlinks inside the checkpoint (or inside the server's weights roots)
still load. Adapters: ``lora_alpha`` must be finite and at most 1e4, merged weights finite, and
``target_modules`` a list of names (a string would be run as a regex: ``(.|.)*Z`` never returns).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from infra.cpu_server.adapters import load_checked_adapter
from infra.cpu_server.weights import WeightLoadError, load_checked_weights, read_config

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(), read_config(
        tiny_model_dir
    )


def _index_dir(tmp: Path, name: str, model_dir: Path, shard: str) -> Path:
    """A checkpoint dir holding config.json and an index that maps every tensor to ``shard``."""
    from safetensors import safe_open

    d = tmp / name
    d.mkdir(parents=True)
    shutil.copy(model_dir / "config.json", d / "config.json")
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    (d / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(names, shard)}))
    return d


def _refusal(served: Any, path: Path, roots: tuple[str, ...] = ()) -> str:
    model, cfg = served
    with pytest.raises(WeightLoadError) as e:
        load_checked_weights(model, cfg, str(path), roots=roots)
    return str(e.value)


def test_a_sharded_checkpoint_inside_its_directory_loads(
    served: Any, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    model, cfg = served
    ck = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir_b).save_pretrained(ck, max_shard_size="100KB")
    assert (ck / INDEX).is_file() and len(list(ck.glob("model-*.safetensors"))) > 1
    out = load_checked_weights(model, cfg, str(ck))
    assert set(out) == {n for n, _ in model.named_parameters()}


def test_index_shards_outside_the_checkpoint_are_refused_without_saying_if_they_exist(
    served: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    real = str(tiny_model_dir_b / "model.safetensors")  # exists, outside the checkpoint
    ghost = str(tmp_path / "nowhere" / "model.safetensors")  # does not exist
    messages = {}
    for label, shard in {"abs": real, "abs-ghost": ghost, "up": "../../b/model.safetensors"}.items():
        msg = _refusal(served, _index_dir(tmp_path / label, "ck", tiny_model_dir, shard))
        assert "not a file name inside the checkpoint directory" in msg, msg
        messages[label] = msg.replace(shard, "<shard>")
    assert messages["abs"] == messages["abs-ghost"]  # the same answer: existence is not revealed
    (tmp_path / "up" / "b").mkdir()
    shutil.copy(real, tmp_path / "up" / "b" / "model.safetensors")  # now ../../b/... exists: still refused
    assert "not a file name inside" in _refusal(
        served, _index_dir(tmp_path / "up2", "ck", tiny_model_dir, "../../b/model.safetensors")
    )


def test_symlinks_out_of_the_checkpoint_are_refused_inside_ones_load(
    served: Any, tiny_model_dir: Path, tiny_model_dir_b: Path, tmp_path: Path
) -> None:
    model, cfg = served
    outside = tiny_model_dir_b / "model.safetensors"
    msgs = []
    for label, target in {"real": outside, "ghost": tmp_path / "ghost.safetensors"}.items():
        ck = tmp_path / label
        ck.mkdir()
        shutil.copy(tiny_model_dir / "config.json", ck / "config.json")
        (ck / "model.safetensors").symlink_to(target)
        msgs.append(_refusal(served, ck).replace(str(ck), "<ck>"))
    assert "resolves outside the directories this server loads from" in msgs[0]
    assert msgs[0] == msgs[1]
    # an index shard reached through a directory symlink is resolved too
    linked = _index_dir(tmp_path / "dirlink", "ck", tiny_model_dir, "sub/model.safetensors")
    (linked / "sub").symlink_to(tiny_model_dir_b)
    assert "resolves outside" in _refusal(served, linked)
    # inside: a symlink to a file of the checkpoint itself, or anywhere under the server's weights roots
    ck = tmp_path / "inside"
    shutil.copytree(tiny_model_dir_b, ck)
    (ck / "model.safetensors").rename(ck / "weights.bin.safetensors")
    (ck / "model.safetensors").symlink_to(ck / "weights.bin.safetensors")
    assert load_checked_weights(model, cfg, str(ck))
    roots = (str(tmp_path),)
    ck2 = tmp_path / "via-root"
    ck2.mkdir()
    shutil.copy(tiny_model_dir / "config.json", ck2 / "config.json")
    (ck2 / "model.safetensors").symlink_to(ck / "weights.bin.safetensors")
    assert "resolves outside" in _refusal(served, ck2)  # no roots: only the checkpoint's own directory
    assert load_checked_weights(model, cfg, str(ck2), roots=roots)  # inside the roots: allowed


# --- adapters ---------------------------------------------------------------------------------------------------

TARGETS = ["q_proj", "v_proj"]


def write_adapter(out: Path, model: torch.nn.Module, *, scale_ab: float = 0.1, **config: Any) -> Path:
    """A peft-format LoRA adapter (rank 2) written by hand: adapter_config.json + lora_A/B tensors."""
    out.mkdir(parents=True)
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": TARGETS, "bias": "none", **config}
    (out / "adapter_config.json").write_text(json.dumps(cfg))  # NaN / Infinity written as JSON allows
    tensors = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.full((2, m.in_features), scale_ab)
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.full((m.out_features, 2), scale_ab)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"lora_alpha": float("nan")}, "lora_alpha must be a finite number in (0, 10000]"),
        ({"lora_alpha": float("inf")}, "lora_alpha must be a finite number"),
        ({"lora_alpha": 1e308}, "lora_alpha must be a finite number"),
        ({"lora_alpha": 1e4, "scale_ab": 1e18}, "merged weight"),  # finite everywhere, inf once merged
        ({"target_modules": "(.|.)*Z"}, "target_modules must be a list of module names"),
        ({"target_modules": ".*q_proj"}, "target_modules must be a list of module names"),
        ({"target_modules": [1, "q_proj"]}, "target_modules must be a non-empty list"),
    ],
    ids=[
        "alpha-nan",
        "alpha-inf",
        "alpha-1e308",
        "merged-overflow",
        "catastrophic-regex",
        "regex",
        "not-names",
    ],
)
def test_adapters_that_would_serve_nan_or_hang_are_refused(
    served: Any, tmp_path: Path, config: dict[str, Any], fragment: str
) -> None:
    model, _ = served
    base = {n: p.data for n, p in model.named_parameters()}
    scale_ab = config.pop("scale_ab", 0.1)
    adapter = write_adapter(tmp_path / "a", model, scale_ab=scale_ab, **config)
    with pytest.raises(WeightLoadError) as e:
        load_checked_adapter(model, base, str(adapter))
    assert fragment in str(e.value)


def test_a_plain_adapter_still_merges(served: Any, tmp_path: Path) -> None:
    model, _ = served
    base = {n: p.data for n, p in model.named_parameters()}
    out = load_checked_adapter(model, base, str(write_adapter(tmp_path / "a", model)))
    name = "model.layers.0.self_attn.q_proj.weight"
    # W' = W + (alpha / r) * B @ A = W + 2 * (0.1 * 0.1 * 2) = W + 0.04 everywhere
    assert torch.allclose(out[name], base[name] + 0.04, atol=1e-6)
