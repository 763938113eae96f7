"""bench/gpu_check.py runs end to end at a tiny size on CPU, without Prefect, MLflow, blake3 or datasets.

The GPU machine it is written for has only torch, transformers, peft, safetensors, pyarrow, fsspec and
numpy: the run here hides the rest (``sys.modules[name] = None``: an import fails, ``find_spec`` says
absent), so an import of any of them on the check's path fails this test.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABSENT = (
    "prefect",
    "mlflow",
    "blake3",
    "s3fs",
    "aiobotocore",
    "datasets",
    "duckdb",
    "math_verify",
    "vllm",
    "sglang",
)
RUN = (
    "import sys, runpy\n"
    f"for name in {ABSENT!r}: sys.modules[name] = None\n"
    "sys.argv = ['gpu_check', *sys.argv[1:]]\n"
    "runpy.run_module('bench.gpu_check', run_name='__main__')\n"
)


def test_tiny_cpu_run_without_the_orchestration_stack(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, "-c", RUN, "--device", "cpu", "--tiny", "--out", str(out), "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = dict(ln.split(" ", 1) for ln in proc.stdout.splitlines() if ln and not ln.startswith("#"))
    record = json.loads(out.read_text())
    figures = record["figures"]
    assert set(lines) == set(figures)
    assert figures["hash"] == "sha256"  # blake3 absent: checkpoints fall back to sha256, still verified
    for key in (
        "train_tokens_per_s",
        "train_peak_mem_GB",
        "weight_update_s",
        "weight_update_GBps",
        "publish_s",
    ):
        assert figures[key] > 0, key
    assert math.isfinite(figures["train_grad_norm"]) and figures["checkpoint_GB"] > 0
    assert 0 < figures["weight_verify_s"] < figures["weight_update_s"]
    # The trainer's logprobs of the generated tokens agree with the decoder's. The tiny model is
    # initialised wide (peaked distributions: the chosen tokens average about -1 nat, a uniform guess is
    # -log 512 = -6.2), so a token scored one position off, or weights that did not load, would be off
    # by several nats on average; bf16 rounding of those wide weights costs about 0.05 (measured 0.03-0.07).
    for mode in ("greedy", "sampled"):
        assert -3.0 < figures[f"{mode}_mean_logp"] < 0
        for dtype in ("bf16", "fp32"):
            mean, top = figures[f"{mode}_{dtype}_mean_abs_dlogp"], figures[f"{mode}_{dtype}_max_abs_dlogp"]
            assert 0 <= mean <= top < 2.0 and mean < 0.3, (mode, dtype, mean, top)
    assert record["settings"]["size"] == "tiny" and "train_mfu" not in figures  # no peak FLOP/s on a CPU
    assert not list(tmp_path.glob("rollflow-gpu-check-*"))  # the published checkpoint is cleaned up
