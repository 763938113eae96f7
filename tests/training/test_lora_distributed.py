"""LoRA under torchrun with 2 CPU ranks (gloo): DDP and FSDP2 train the same adapter as one process.

The setting of ``test_distributed`` (2 steps x 4 groups, 2 PPO minibatches, several micro-batches per
rank, KL to the reference on) with ``train.lora`` on: the reference is the policy with its adapter off,
the frozen base is sharded (FSDP2) or replicated (DDP) beside the trainable adapter, and rank 0
publishes the adapter from a full state dict. Compared: per-step loss, KL and grad norm, and the
published adapter of the last version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import write_groups
from safetensors.torch import load_file
from test_distributed import GIDS, ROOT, _cfg, _free_port

from rollflow.api.metrics import InMemorySink
from rollflow.configuration.loader import load_config
from rollflow.training.trainer import Trainer
from storage import keys
from storage.checkpoints import ADAPTER_WEIGHTS_NAME
from storage.fs import Storage

pytestmark = pytest.mark.slow

LORA = {"rank": 4, "alpha": 8.0}


def _lora_cfg(root: str, trial: str, model_dir: Path) -> dict:
    cfg = _cfg(root, trial, model_dir)
    cfg["train"].update(lr=1e-2, lora=LORA)
    return cfg


def _adapter(storage: Storage, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(storage.local_path(keys.checkpoint_dir(version)) / ADAPTER_WEIGHTS_NAME))


@pytest.fixture(scope="module")
def single_lora(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> tuple[Storage, InMemorySink]:
    root = str(tmp_path_factory.mktemp("single-lora") / "store")
    storage = Storage.open(root, "dist", "single")
    write_groups(storage, GIDS, per_shard=3)
    sink = InMemorySink()
    assert (
        Trainer(load_config(data=_lora_cfg(root, "single", tiny_model_dir)), storage, metrics=sink).run().done
    )
    return storage, sink


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_train_the_same_adapter(
    mode: str, single_lora, tmp_path: Path, tiny_model_dir: Path
) -> None:
    ref_storage, ref = single_lora
    root = str(tmp_path / "store")
    storage = Storage.open(root, "dist", mode)
    write_groups(storage, GIDS, per_shard=3)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(_lora_cfg(root, mode, tiny_model_dir)))
    metrics = tmp_path / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), "-m", "rollflow.training.run", "--config", str(cfg_path),
        "--metrics-jsonl", str(metrics), f"train.distributed={mode}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["done"] and summary["published_versions"] == [0, 1, 2]

    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["loss"] for r in rows] == pytest.approx(ref.values("loss"), abs=1e-6)
    assert [r["kl"] for r in rows] == pytest.approx(ref.values("kl"), abs=1e-7)
    assert [r["grad_norm"] for r in rows] == pytest.approx(ref.values("grad_norm"), rel=1e-5)
    a, b = _adapter(ref_storage, 2), _adapter(storage, 2)
    assert a.keys() == b.keys() and len(a) == 2 * 2 * 7  # 2 layers x 7 linear layers x (A, B)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
