"""One read of a safetensors file, hashed on the way (``rollflow/models/verified_weights.py``).

The tensors must be exactly safetensors' own, the digest exactly ``hash_file``'s, and a file whose bytes
differ from COMMIT.json, or whose header cannot be trusted, must give no tensors at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rollflow.models.verified_weights import (
    load_verified_dir,
    load_verified_safetensors,
    read_safetensors_hashed,
)
from storage.errors import CheckpointIntegrityError
from storage.transfer import hash_file

ALGOS = ["sha256", "blake3"]


def _file(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(300, 70, generator=g),  # [300, 70] fp32: 84 kB
        "b.bias": torch.randn(7, generator=g).to(torch.bfloat16),
        "c.ids": torch.arange(5, dtype=torch.int64),
        "d.empty": torch.zeros(0, 4),
        "e.scalar": torch.tensor(3.0),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def _expect(path: Path, algo: str) -> dict[str, object]:
    d = hash_file(path, algo)
    return {"size": d.size, algo: d.digest}


@pytest.mark.parametrize("algo", ALGOS)
def test_tensors_and_digest_match_safetensors_and_hash_file(tmp_path: Path, algo: str) -> None:
    path = _file(tmp_path)
    tensors, digest = read_safetensors_hashed(path, algo)
    want = load_file(str(path))
    assert set(tensors) == set(want)
    for k, t in want.items():
        assert tensors[k].dtype == t.dtype and torch.equal(tensors[k], t), k
    assert digest == hash_file(path, algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_a_changed_byte_gives_no_tensors(tmp_path: Path, algo: str) -> None:
    path = _file(tmp_path)
    expect = _expect(path, algo)
    data = bytearray(path.read_bytes())
    data[-200] ^= 0x01  # one bit inside a tensor, same size
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError, match=f"'model.safetensors'.*{algo}"):
        load_verified_safetensors(path, expect, algo, "model.safetensors")


def test_a_header_that_does_not_tile_the_data_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    start, end = header["a.weight"]["data_offsets"]
    header["a.weight"]["data_offsets"] = [start + 4, end + 4]  # overlaps the next tensor
    new = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(new) == n
    path.write_bytes(raw[:8] + new + raw[8 + n :])
    with pytest.raises(CheckpointIntegrityError, match="starts at"):
        read_safetensors_hashed(path, "sha256")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointIntegrityError, match="header describes"):
        read_safetensors_hashed(path, "sha256")


def test_a_directory_loads_only_what_commit_lists(tmp_path: Path) -> None:
    path = _file(tmp_path)
    files = {"model.safetensors": _expect(path, "sha256")}
    assert set(load_verified_dir(tmp_path, files, "sha256")) == set(load_file(str(path)))
    with pytest.raises(CheckpointIntegrityError, match="not in COMMIT.json"):
        load_verified_dir(tmp_path, {}, "sha256")


def test_into_fills_the_given_tensors_and_fresh_memory_for_the_rest(tmp_path: Path) -> None:
    path = _file(tmp_path)
    standby = {"a.weight": torch.zeros(300, 70), "b.bias": torch.zeros(3)}  # b: wrong shape, not reused
    tensors, _ = read_safetensors_hashed(path, "sha256", into=standby)
    assert tensors["a.weight"] is standby["a.weight"]
    assert torch.equal(standby["a.weight"], load_file(str(path))["a.weight"])
    assert tensors["b.bias"] is not standby["b.bias"] and torch.equal(standby["b.bias"], torch.zeros(3))
