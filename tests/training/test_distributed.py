"""The same trainer under torchrun with 2 CPU ranks (gloo): DDP and FSDP2 match the single-process run.

``fsdp2-2nodes``: the 2 ranks as 2 nodes, i.e. two torchrun agents (``--nnodes 2 --nproc_per_node 1``)
meeting at a c10d rendezvous on 127.0.0.1, as ``train.nnodes: 2`` launches them on two machines.

Both runs read the same shards (2 steps x 4 groups, 2 PPO minibatches, micro-batch budget small enough
to give ranks several micro-batches, KL to the reference on). Rank 0 reads and broadcasts each batch,
groups are split across ranks by tokens, rank 0 publishes from a full state dict. Compared: the
per-step loss and the published weights of the last version, and the consumed groups.

FSDP2 (``torch.distributed.fsdp.fully_shard``) runs on CPU with gloo in torch 2.13, so it is tested
here directly, not only on GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import write_groups
from safetensors.torch import load_file

from rollflow.api.metrics import InMemorySink
from rollflow.configuration.loader import load_config
from rollflow.training.trainer import Trainer
from storage import keys
from storage.fs import Storage
from storage.keys import consumed_key

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

GIDS = [f"g{i:02d}" for i in range(8)]


def _cfg(root: str, trial: str, model_dir: Path) -> dict:
    return {
        "experiment": "dist",
        "trial": trial,
        "storage": {"root": root},
        "model": {"path": str(model_dir)},
        "rollout": {"max_staleness": 100, "group_size": 4},
        "train": {
            "steps": 2,
            "batch_size": 4,
            "ppo_n_minibatches": 2,
            "max_tokens_per_mb": 48,
            "lr": 1e-3,
            "kl_ctl": 0.05,
            "resume_every": 1,
            "data_wait_timeout_s": 60.0,
            "threads": 1,
        },
    }


def _weights(storage: Storage, version: int) -> dict[str, torch.Tensor]:
    return load_file(str(storage.local_path(keys.checkpoint_dir(version)) / "model.safetensors"))


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Storage, InMemorySink]:
    root = str(tmp_path_factory.mktemp("single") / "store")
    storage = Storage.open(root, "dist", "single")
    write_groups(storage, GIDS, per_shard=3)
    sink = InMemorySink()
    assert Trainer(load_config(data=_cfg(root, "single", tiny_model_dir)), storage, metrics=sink).run().done
    return storage, sink


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_agents(cfg_path: Path, extra: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Two torchrun agents, each the line ``train.nnodes: 2`` gives every node (flows/gpu_plan.py), meeting
    at a c10d rendezvous on 127.0.0.1; returns global rank 0's output and the worst exit code."""
    from flows.gpu_plan import torchrun_command

    nodes = ["train.nnodes=2", "train.nproc_per_node=1", f"train.rdzv_endpoint=127.0.0.1:{_free_port()}"]
    cfg = load_config(str(cfg_path), [*nodes, *extra[2:]])
    cmd = torchrun_command(cfg, str(cfg_path), [*extra, *nodes])
    assert "--nnodes=2" in cmd and "--rdzv_backend=c10d" in cmd
    agents = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [a.communicate(timeout=300) for a in agents]
    (rank0,) = [o for o in outs if o[0].strip()] or [outs[0]]  # only global rank 0 prints the summary
    code = max(a.returncode for a in agents)
    return subprocess.CompletedProcess(cmd, code, rank0[0], "\n".join(o[1] for o in outs))


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "fsdp2-2nodes"])
def test_two_ranks_match_single_process(mode: str, single, tmp_path: Path, tiny_model_dir: Path) -> None:
    ref_storage, ref = single
    root = str(tmp_path / "store")
    storage = Storage.open(root, "dist", mode)
    write_groups(storage, GIDS, per_shard=3)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(_cfg(root, mode, tiny_model_dir)))
    metrics = tmp_path / "metrics.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "rollflow.training.run",
        "--config",
        str(cfg_path),
        "--metrics-jsonl",
        str(metrics),
        f"train.distributed={mode.split('-')[0]}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if mode.endswith("-2nodes"):
        proc = _run_agents(cfg_path, cmd[-3:], env)
    else:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["done"] and summary["final_version"] == 2 and summary["published_versions"] == [0, 1, 2]

    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["loss"] for r in rows] == pytest.approx(ref.values("loss"), abs=1e-6)
    assert [r["kl"] for r in rows] == pytest.approx(ref.values("kl"), abs=1e-7)
    # Adam hides gradient scale in the weights; the grad norm does not (a wrong world_size factor = 2x)
    assert [r["grad_norm"] for r in rows] == pytest.approx(ref.values("grad_norm"), rel=1e-5)
    for s in (1, 2):
        assert storage.get_json(consumed_key(s))["groups"] == ref_storage.get_json(consumed_key(s))["groups"]
    a, b = _weights(ref_storage, 2), _weights(storage, 2)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
    # the resume point holds the full (unsharded) optimizer state, loadable by a single process
    point = storage.get_json(keys.trainer_state_key(2))
    assert point["world_size"] == 2 and len(point["rng"]) == 2

    # A resume point written by 2 ranks resumes in a single process (full, unsharded state).
    write_groups(storage, ["h0", "h1", "h2", "h3"], per_shard=4)
    cfg = _cfg(root, mode, tiny_model_dir)
    cfg["train"]["steps"] = 3
    again = Trainer(load_config(data=cfg), storage).run()
    assert again.resumed_from == 2 and again.done and again.published_versions == [3]
    assert storage.get_json(consumed_key(3))["groups"] == ["h0", "h1", "h2", "h3"]
