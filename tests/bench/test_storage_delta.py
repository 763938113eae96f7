"""bench.storage's delta-checkpoint figures: the byte counting, by hand, and a smoke run of the real trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import bench._common
from bench.storage import main
from bench.storage_delta import pair_figures, weight_bytes
from rollflow.training.publish import write_safetensors


def _version(path: Path, values: list[float], dtype: torch.dtype) -> Path:
    path.mkdir()
    write_safetensors(
        path / "model.safetensors", {"w": torch.tensor(values, dtype=dtype)}, metadata={}, hash_algo=None
    )
    return path


def test_pair_figures_count_changed_elements_and_encoded_bytes(tmp_path: Path) -> None:
    base = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    moved = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.03125, 8.0625]  # two elements, one bf16 ulp each
    a, size = weight_bytes(_version(tmp_path / "v0", base, torch.bfloat16))
    b, _ = weight_bytes(_version(tmp_path / "v1", moved, torch.bfloat16))
    f = pair_figures(a, b, size)
    assert f["changed_fraction"] == 2 / 8
    # 7 -> 7.03125 (0x40E0 -> 0x40E1) and 8 -> 8.0625 (0x4100 -> 0x4101) flip the low byte: 2 of 16 bytes
    assert f["changed_byte_fraction"] == 2 / 16
    assert f["sparse_ratio"] == pytest.approx(2 * (2 + 4) / size)  # index + bf16 value per change
    assert f["bitmask_ratio"] == pytest.approx((1 + 2 * 2) / size)  # 8 bits of mask + 2 values
    assert 0 < f["xor_zlib_ratio"] < 1
    assert f["best_ratio"] == min(f["sparse_ratio"], f["bitmask_ratio"], f["xor_zlib_ratio"])
    assert pair_figures(a, a, size)["changed_fraction"] == 0.0


def test_versions_of_another_layout_are_refused(tmp_path: Path) -> None:
    a, size = weight_bytes(_version(tmp_path / "v0", [1.0, 2.0], torch.float32))
    b, _ = weight_bytes(_version(tmp_path / "v1", [1.0, 2.0], torch.bfloat16))
    with pytest.raises(ValueError, match="different tensors, dtypes or shapes"):
        pair_figures(a, b, size)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no safetensors weights"):
        weight_bytes(tmp_path / "empty")


def test_delta_only_prints_every_key_with_a_fraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench._common, "RESULTS_DIR", tmp_path / "results")
    main(["--delta-only", "--quick"])  # 3 trainer steps x 2 dtypes x 2 lrs, the untrained tiny model
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    figures = {k: float(v) for k, v in lines}
    suffixes = ("", "_lr_div10")
    expected = {f"delta_changed_fraction_{d}{s}" for d in ("fp32", "bf16") for s in suffixes}
    expected |= {f"storage_bytes_per_version_ratio_{d}{s}" for d in ("fp32", "bf16") for s in suffixes}
    assert set(figures) == expected | {"storage_bytes_per_version_ratio"}
    assert all(0.0 <= v <= 1.0 for v in figures.values()), figures
    # Adam moves every float32 weight each step; bf16 rounding hides some of those moves
    assert figures["delta_changed_fraction_fp32"] > 0.9
    assert figures["delta_changed_fraction_bf16"] < figures["delta_changed_fraction_fp32"]
    assert figures["storage_bytes_per_version_ratio"] == figures["storage_bytes_per_version_ratio_bf16"]
    assert (tmp_path / "results" / "storage_delta.json").exists()
