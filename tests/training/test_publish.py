"""Checkpoint publishing: loadable HF dirs, version order, the restart floor, background errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollflow.api.errors import TrainerError
from rollflow.training.publish import CheckpointPublisher, tied_aliases, write_hf_dir
from storage.checkpoints import CheckpointStore


def _model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_published_checkpoint_loads_and_matches(tiny_model_dir: Path, storage, tmp_path: Path) -> None:
    model = _model(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # make it differ from the files on disk
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    store = CheckpointStore(storage)
    pub = CheckpointPublisher(store, config=model.config, tokenizer=tok, architecture="LlamaForCausalLM")
    assert pub.submit(0, sd, step=0)
    pub.flush()
    ref = store.resolve_latest()
    assert ref is not None and ref.version == 0
    local = store.fetch(0, tmp_path / "cache")
    again = _model(local)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)
    assert AutoTokenizer.from_pretrained(local).encode("1+2") == tok.encode("1+2")


def test_bf16_publish_records_its_dtype(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = _model(tiny_model_dir)
    write_hf_dir(
        tmp_path / "out",
        dict(model.state_dict()),
        config=model.config,
        tokenizer=None,
        dtype=torch.bfloat16,
        architecture="LlamaForCausalLM",
    )
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert model.config.dtype == torch.float32  # the live config is untouched
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert back.dtype == torch.bfloat16


def test_tied_aliases() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(4, 2)
            self.head = torch.nn.Linear(2, 4, bias=False)
            self.head.weight = self.emb.weight

    assert tied_aliases(Tied()) == {"head.weight"}


class SlowStore:
    """Records publish order; each publish takes a while; can be told to fail."""

    hash_algo = None  # hashes nothing the publisher wrote (the CheckpointSink contract)

    def __init__(self, fail_on: int | None = None) -> None:
        self.order: list[int] = []
        self.active = 0
        self.max_active = 0
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def staging_dir(self, version: int) -> None:
        return None

    def publish(self, local_dir, version, *, step=None, meta=None):
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(0.05)
        assert (Path(local_dir) / "model.safetensors").exists()
        with self.lock:
            self.active -= 1
        if version == self.fail_on:
            raise OSError("disk full")
        self.order.append(version)

    def gc(self, keep_last: int) -> list[int]:
        return []


def test_background_publishes_in_order_one_at_a_time(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    store = SlowStore()
    pub = CheckpointPublisher(store, config=model.config, tokenizer=None, floor=2, background=True)
    sd = dict(model.state_dict())
    assert not pub.submit(1, sd, step=1)  # <= floor: already in storage from a previous life
    assert not pub.submit(2, sd, step=2)
    for v in (3, 4, 5):
        assert pub.submit(v, sd, step=v)
    pub.flush()
    assert store.order == [3, 4, 5] and store.max_active == 1 and pub.published == [3, 4, 5]


def test_background_failure_surfaces_on_next_call(tiny_model_dir: Path) -> None:
    model = _model(tiny_model_dir)
    pub = CheckpointPublisher(SlowStore(fail_on=1), config=model.config, tokenizer=None, background=True)
    pub.submit(1, dict(model.state_dict()), step=1)
    with pytest.raises(TrainerError, match="disk full"):
        pub.flush()
