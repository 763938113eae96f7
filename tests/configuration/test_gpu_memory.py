"""The trainer's memory estimate in ``rollflow plan``: the arithmetic, and the verdict for the shipped GPU
configs (the one-GPU case that ran out of memory is refused with a fix)."""

from __future__ import annotations

from pathlib import Path

from rollflow.configuration.gpu_memory import (
    KNOWN_SHAPES,
    max_fitting_tokens,
    memory_verdict,
    model_shape,
    trainer_peak_gb,
)
from rollflow.configuration.loader import load_config


def test_the_logits_dominate_at_a_large_vocabulary() -> None:
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"]
    small, big = (trainer_peak_gb(shape, t, gradient_checkpointing=True) for t in (4096, 16384))
    # 12 bytes a token x vocabulary for the 12,288 more tokens, x 1.5 (the measured factor with checkpointing)
    logits = 1.5 * 12 * 12288 * 151_936 / 1e9
    assert logits < big - small and logits > 0.8 * (big - small)
    assert trainer_peak_gb(shape, 16384, gradient_checkpointing=False) > big
    assert trainer_peak_gb(shape, 16384, gradient_checkpointing=True, ranks=8) < big
    fit = max_fitting_tokens(shape, 20.0, gradient_checkpointing=True)
    assert fit % 1024 == 0 and trainer_peak_gb(shape, fit, gradient_checkpointing=True) <= 20.0
    assert trainer_peak_gb(shape, fit + 1024, gradient_checkpointing=True) > 20.0


def test_the_estimate_bounds_the_peaks_measured_on_a_card() -> None:
    """The GPU check's memory sweep on an H200 (bench/results/gpu_check.json): the estimate is at or above
    every measured peak, and not by more than a third (a plan that refuses what fits is no use either)."""
    import json

    record = json.loads(Path("bench/results/gpu_check.json").read_text())
    assert "H200" in record["device"]
    measured = {k: v for k, v in record["figures"].items() if k.startswith("mem_") and k.endswith("_GB")}
    assert len(measured) == 12
    for key, peak in measured.items():
        _, size, mb, gc, _ = key.split("_")  # mem_0.5b_mb4096_gc1_GB
        shape = KNOWN_SHAPES[f"Qwen/Qwen2.5-{size.upper()}-Instruct"]
        est = trainer_peak_gb(shape, int(mb[2:]), gradient_checkpointing=gc == "gc1")
        assert peak <= est <= 1.34 * peak, (key, peak, est)


def test_a_local_model_directory_gives_its_shape(tmp_path: Path) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100,
        "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": False,
    }))  # fmt: skip
    shape = model_shape(str(tmp_path))
    assert shape is not None and shape.vocab == 100 and shape.layers == 2
    # q, o: 64x64 each; k, v: 64x32 each; MLP 3 x 64x128; 2 norms; embeddings in and out; final norm
    assert shape.params == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 2 * 100 * 64 + 64
    assert model_shape("nobody/unknown") is None


def test_the_plan_says_what_fits() -> None:
    alone = memory_verdict(load_config("configs/qwen_1node.yaml"), 80.0)
    assert "alone on GPU 0" in alone and alone.endswith(": fits")
    shared = memory_verdict(load_config("configs/qwen_1node.yaml", ["inference.sglang.base_gpu_id=0"]), 80.0)
    assert "beside SGLang's 64 GB" in shared and "DOES NOT FIT" in shared and "base_gpu_id: 1" in shared
    pools = memory_verdict(load_config("configs/gsm8k_qwen.yaml", ["orchestration.mode=distributed"]), 80.0)
    assert "8 FSDP2 ranks" in pools and pools.endswith(": fits")
