"""LoRA training (train.lora): only the adapter learns, the reference is the base, resume is exact.

Real trainer runs on real shards in local storage with the tiny Llama; the published adapter is read
back with peft's own loader.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from helpers import write_groups
from safetensors.torch import load_file
from test_trainer import StopAt, consumed, make_cfg

from rollflow.api.config import LoraConfig
from rollflow.api.errors import ConfigError
from rollflow.api.metrics import InMemorySink
from rollflow.configuration.loader import load_config
from rollflow.training.lora import (
    AdapterDisabled,
    adapter_tensors,
    apply_lora,
    merge_adapter_dir,
)
from rollflow.training.resume import MODEL_BLOB, list_resume_steps
from rollflow.training.trainer import Trainer
from storage import keys
from storage.checkpoints import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from storage.fs import Storage

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _base(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _adapter(storage: Storage, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(storage.local_path(keys.checkpoint_dir(version)) / ADAPTER_WEIGHTS_NAME))


def test_only_the_adapter_gets_gradients_and_optimizer_state(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = str(tmp_path / "store")
    storage = Storage.open(root, "test", "lora")
    write_groups(storage, [f"g{i}" for i in range(4)])
    # one pass per step: the first step's KL is then taken at the reference itself (exactly 0)
    cfg = make_cfg(
        root, "test", "lora", tiny_model_dir, steps=2, lr=1e-2, kl_ctl=0.1, lora=LORA, ppo_epochs=1
    )
    sink = InMemorySink()
    trainer = Trainer(cfg, storage, metrics=sink)
    assert trainer.run().done

    named = dict(trainer.model.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    # 2 layers x 3 targets x (A, B) = 12 adapter matrices, nothing else
    assert len(trained) == 12 and all(".lora_A." in n or ".lora_B." in n for n in trained)
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(named[n]) for n in trained}
    assert set(trainer.optimizer.state) <= {named[n] for n in trained}  # Adam moments: adapter only
    assert all(named[n].grad is None for n in named if n not in trained)

    # the frozen base is bit-identical to the checkpoint it came from
    base = dict(_base(tiny_model_dir).named_parameters())
    for n, p in named.items():
        if n not in trained:
            plain = n.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(p, base[plain]), n
    # B starts at 0, so the first step's KL to the reference (the base) is exactly 0; then it is not
    assert sink.values("kl")[0] == 0.0 and sink.values("kl")[1] > 0

    # a version holds only the adapter: two files, its tensors under peft's names, B trained away from 0
    ck = storage.local_path(keys.checkpoint_dir(2))
    assert sorted(p.name for p in ck.iterdir()) == ["COMMIT.json", ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME]
    tensors = _adapter(storage, 2)
    assert len(tensors) == 12
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert all(tensors[k].abs().max() > 0 for k in tensors if ".lora_B." in k)
    assert all(torch.equal(v, 0 * v) for k, v in _adapter(storage, 0).items() if ".lora_B." in k)
    commit = storage.get_json(keys.checkpoint_commit_key(2))
    assert commit["meta"]["kind"] == "adapter" and commit["meta"]["lora_rank"] == 4
    doc = json.loads((ck / ADAPTER_CONFIG_NAME).read_text())
    assert (
        doc["r"] == 4 and doc["lora_alpha"] == 8.0 and doc["base_model_name_or_path"] == str(tiny_model_dir)
    )


def test_published_adapter_loads_with_peft_and_matches_the_trained_policy(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from peft import PeftModel

    root = str(tmp_path / "store")
    storage = Storage.open(root, "test", "peft")
    write_groups(storage, [f"g{i}" for i in range(4)])
    trainer = Trainer(make_cfg(root, "test", "peft", tiny_model_dir, steps=2, lr=1e-2, lora=LORA), storage)
    assert trainer.run().done
    loaded = PeftModel.from_pretrained(_base(tiny_model_dir), storage.local_path(keys.checkpoint_dir(2)))
    ids = torch.tensor([[2, 7, 9, 11, 5, 30, 12]])
    trainer.model.eval()
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        got = loaded.eval()(input_ids=ids).logits
        base = _base(tiny_model_dir)(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert (want - base).abs().max() > 1e-4  # the adapter changed the policy


def test_the_reference_is_the_base_model_without_a_second_copy(tiny_model_dir: Path) -> None:
    policy = apply_lora(_base(tiny_model_dir), LoraConfig(rank=4), seed=1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_()  # a trained adapter
    ref = AdapterDisabled(policy)
    assert list(ref.parameters()) == [] and ref.state_dict() == {}  # shares the policy's weights
    ids = torch.tensor([[2, 7, 9, 11, 5, 30]])
    with torch.no_grad():
        base = _base(tiny_model_dir)(input_ids=ids).logits
        torch.testing.assert_close(ref.eval()(input_ids=ids).logits, base, atol=0, rtol=0)
        assert (policy(input_ids=ids).logits - base).abs().max() > 1e-3  # adapter back on afterwards
    assert not policy.training  # eval() reached the policy


def test_lora_init_does_not_depend_on_the_rank_seed(tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    a = adapter_tensors(apply_lora(_base(tiny_model_dir), LoraConfig(rank=4), seed=7).state_dict())
    torch.manual_seed(1)  # rank 1 seeds differently; the adapter must still be the same
    b = adapter_tensors(apply_lora(_base(tiny_model_dir), LoraConfig(rank=4), seed=7).state_dict())
    assert a.keys() == b.keys() and len(a) == 2 * 2 * 7
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stop_and_resume_with_lora_reproduce_the_uninterrupted_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    gids = [f"g{i:02d}" for i in range(8)]
    root = str(tmp_path / "store")
    train = {"steps": 4, "resume_every": 3, "lr": 1e-2, "kl_ctl": 0.05, "lora": LORA}
    straight = Storage.open(root, "test", "straight")
    write_groups(straight, gids)
    assert Trainer(make_cfg(root, "test", "straight", tiny_model_dir, **train), straight).run().done

    split = Storage.open(root, "test", "split")
    write_groups(split, gids)
    cfg = make_cfg(root, "test", "split", tiny_model_dir, **train)
    stop = threading.Event()
    first = Trainer(cfg, split, stop_event=stop, hooks=StopAt(stop, at=2)).run()
    assert first.stopped and first.final_version == 2 and list_resume_steps(split) == [2]
    # the resume point holds the adapter only: the base is re-read from model.path
    blob = split.local_path(keys.trainer_state_dir(2)) / MODEL_BLOB
    assert all(".lora_" in k for k in load_file(str(blob)))

    second = Trainer(cfg, split).run()
    assert second.resumed_from == 2 and second.done and second.published_versions == [3, 4]
    assert consumed(split, 4) == consumed(straight, 4)
    a, b = _adapter(straight, 4), _adapter(split, 4)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0)  # bit-exact: adapter, Adam moments, lr


def test_bad_lora_settings_are_refused_with_the_fix(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert not LoraConfig().enabled  # off by default: rank 0 is full fine-tuning
    with pytest.raises(ConfigError, match=r"train\.lora\.rank"):
        load_config(data={"train": {"lora": {"rank": -1}}})
    with pytest.raises(ConfigError, match=r"train\.lora\.target_modules"):
        load_config(data={"train": {"lora": {"rank": 4, "target_modules": []}}})
    with pytest.raises(ConfigError, match=r"\['qkv_proj'\] match no linear layer.*'q_proj'"):
        apply_lora(_base(tiny_model_dir), LoraConfig(rank=4, target_modules=["q_proj", "qkv_proj"]), seed=0)


def test_merged_adapter_loads_with_transformers_and_generates(tmp_path: Path, tiny_model_dir: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = apply_lora(_base(tiny_model_dir), LoraConfig(rank=4), seed=1)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)
    policy.save_pretrained(tmp_path / "adapter")
    out = merge_adapter_dir(str(tiny_model_dir), tmp_path / "adapter", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[2, 7, 9, 11, 5]])
    with torch.no_grad():
        want = (
            PeftModel.from_pretrained(_base(tiny_model_dir), tmp_path / "adapter")
            .eval()(input_ids=ids)
            .logits
        )
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        gen = merged.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert gen.shape == (1, 10)
    assert (out / "tokenizer.json").is_file() and not (out / "adapter_config.json").exists()
