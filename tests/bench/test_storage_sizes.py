"""bench.storage --size at the tiny shape: every figure is produced, the checkpoints it times are real
(published, verified, loaded), and nothing is left on disk."""

from __future__ import annotations

from pathlib import Path

import torch

from bench import qwen2_shapes
from bench.storage_sizes import measure

KEYS = {"publish_vs_raw", "fetch_vs_raw", "load_vs_raw", "publish_GBps", "raw_save_GBps", "fetch_GBps"}


def test_tiny_sizes_and_lora_report_every_figure(tmp_path: Path) -> None:
    figures, details = measure("tiny", 1, tmp_path / "scratch", lora_rank=4)
    for prefix in ("tiny_", "tiny_lora4_"):
        assert {f"{prefix}{k}" for k in KEYS} <= set(figures)
        assert all(figures[f"{prefix}{k}"] > 0 for k in KEYS)
        # the bound beside the ratio: one hash pass on top of the raw load/save can only add time
        for k in ("load_floor_vs_raw", "publish_floor_vs_raw", "load_vs_raw_16core_computed"):
            assert figures[f"{prefix}{k}"] > 1
        assert (
            figures[f"{prefix}hash_1core_GBps"] > 0
            and figures[f"{prefix}load_two_reads_vs_raw"] > 0
            and figures[f"{prefix}load_overlap_floor_vs_raw"] >= 1
        )
    model = qwen2_shapes.build("tiny")
    n_bytes = sum(p.numel() * 2 for p in model.parameters())  # bf16, the tied lm_head saved once
    assert details["bytes"] == n_bytes and details["params"] == qwen2_shapes.param_count(model)
    # rank r on every linear of the block: r x (in + out) summed, per layer
    d, f, kv = 64, 128, 2 * (64 // 4)
    per_layer = 4 * ((d + d) + 2 * (d + kv) + (d + d) + 2 * (d + f) + (f + d))
    assert details["lora"]["bytes"] == 2 * per_layer * 2  # 2 layers, bf16
    assert not (tmp_path / "scratch").exists()


def test_shapes_match_the_published_qwen_models() -> None:
    # Qwen2.5-0.5B: 494,032,768 parameters (its model card: 0.49B); counted from the config, on meta
    with torch.device("meta"):
        from transformers import Qwen2ForCausalLM

        small = Qwen2ForCausalLM(qwen2_shapes.config("0.5b"))
        large = Qwen2ForCausalLM(qwen2_shapes.config("1.5b"))
    assert qwen2_shapes.param_count(small) == 494_032_768
    assert qwen2_shapes.param_count(large) == 1_543_714_304  # Qwen2.5-1.5B: 1.54B
