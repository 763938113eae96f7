"""Resume points: optimizer flattening, RNG, atomic commit order, fallback past broken points, GC."""

from __future__ import annotations

import random

import numpy as np
import torch

from rollflow.training.optim import build_optimizer
from rollflow.training.resume import (
    ResumePoint,
    capture_rng,
    find_latest_resume_point,
    flatten_optimizer_state,
    gc_resume_points,
    list_resume_steps,
    load_resume_blobs,
    restore_rng,
    unflatten_optimizer_state,
    write_resume_point,
)
from storage import keys


def _trained_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = build_optimizer(m.named_parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        m(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return m, opt


def _full_osd(m: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(m, opt)


def test_optimizer_state_flatten_roundtrip() -> None:
    m, opt = _trained_optimizer()
    osd = _full_osd(m, opt)
    tensors, meta = flatten_optimizer_state(osd)
    assert set(tensors) >= {"state/0.weight/exp_avg", "state/0.weight/exp_avg_sq", "state/1.bias/step"}
    import json

    back = unflatten_optimizer_state(tensors, json.loads(json.dumps(meta)))  # meta survives JSON
    assert back["param_groups"][0]["betas"] == osd["param_groups"][0]["betas"]
    for fqn, entries in osd["state"].items():
        for k, v in entries.items():
            assert torch.equal(back["state"][fqn][k], v), (fqn, k)


def test_rng_roundtrip() -> None:
    state = capture_rng()
    a = (torch.rand(3), random.random(), np.random.rand())
    restore_rng(state)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2]


def _point(step: int) -> ResumePoint:
    return ResumePoint(
        step=step,
        version=step,
        cursor={"format": 1},
        scheduler={"last_epoch": step},
        optimizer_meta={},
        rng=[capture_rng()],
        counters={"groups_consumed": 2 * step},
    )


def test_write_find_load_and_fallback(local_storage) -> None:
    m, opt = _trained_optimizer()
    model_sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    write_resume_point(local_storage, _point(2), model_sd, _full_osd(m, opt))
    write_resume_point(local_storage, _point(4), model_sd, _full_osd(m, opt))
    latest = find_latest_resume_point(local_storage)
    assert latest is not None and latest.step == 4 and latest.counters == {"groups_consumed": 8}
    sd, osd = load_resume_blobs(local_storage, latest)
    assert all(torch.equal(sd[k], model_sd[k]) for k in model_sd)
    assert torch.equal(osd["state"]["0.weight"]["exp_avg"], opt.state[m[0].weight]["exp_avg"])

    # A crash between blob upload and JSON commit leaves no JSON: that point does not exist.
    local_storage.put_bytes(f"{keys.trainer_state_dir(6)}/model.safetensors", b"partial")
    assert find_latest_resume_point(local_storage).step == 4  # type: ignore[union-attr]
    # A committed point whose blob went missing is skipped for the previous one.
    local_storage.delete(f"{keys.trainer_state_dir(4)}/optimizer.safetensors")
    assert find_latest_resume_point(local_storage).step == 2  # type: ignore[union-attr]


def test_corrupt_blob_is_detected(local_storage) -> None:
    import pytest

    from rollflow.api.errors import TrainerError

    m, opt = _trained_optimizer()
    write_resume_point(local_storage, _point(1), dict(m.state_dict()), _full_osd(m, opt))
    key = f"{keys.trainer_state_dir(1)}/model.safetensors"
    data = bytearray(local_storage.get_bytes(key))
    data[-1] ^= 0xFF  # same size, different content
    local_storage.put_bytes(key, bytes(data))
    point = find_latest_resume_point(local_storage)
    with pytest.raises(TrainerError, match="sha256"):
        load_resume_blobs(local_storage, point)  # type: ignore[arg-type]


def test_gc_keeps_newest_and_removes_orphans(local_storage) -> None:
    m, opt = _trained_optimizer()
    for step in (1, 2, 3):
        write_resume_point(local_storage, _point(step), dict(m.state_dict()), _full_osd(m, opt))
    local_storage.put_bytes(f"{keys.trainer_state_dir(0)}/model.safetensors", b"orphan")
    local_storage.put_bytes(f"{keys.trainer_state_dir(9)}/model.safetensors", b"being written")
    gc_resume_points(local_storage, keep=2)
    assert list_resume_steps(local_storage) == [2, 3]
    left = local_storage.list(keys.TRAINER_DIR)
    assert not any(k.startswith((keys.trainer_state_dir(0), keys.trainer_state_dir(1))) for k in left)
    assert f"{keys.trainer_state_dir(9)}/model.safetensors" in left  # newer than any commit: in flight


def test_unreadable_resume_point_json_is_skipped_for_the_previous_one(local_storage) -> None:
    import pytest

    from rollflow.api.errors import TrainerError
    from rollflow.training.resume import read_resume_point

    m, opt = _trained_optimizer()
    model_sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    write_resume_point(local_storage, _point(2), model_sd, _full_osd(m, opt))
    write_resume_point(local_storage, _point(4), model_sd, _full_osd(m, opt))
    for bad in (b"[" * 200_000 + b"]" * 200_000, b"[1, 2]", b"{not json", b'{"format": 1}'):
        local_storage.put_bytes(keys.trainer_state_key(4), bad)
        with pytest.raises(TrainerError, match="state-00000004.json|resume point"):
            read_resume_point(local_storage, 4)
        assert find_latest_resume_point(local_storage).step == 2  # type: ignore[union-attr]
