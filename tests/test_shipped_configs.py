"""Every config under ``configs/`` starts clean: no WARNING and no traceback in what its command prints.

Each config runs the cheapest command that resolves it the way a user's run does, in a subprocess (a
Python warning is shown once per process, so each gets its own):

- the CPU configs: one training step (``train.steps=1``): config resolution, the dataset or task
  checks, the servers, the "before" and "after" evaluations and the MLflow run with its dataset inputs.
  ``configs/tiny_hard.yaml`` runs as ``make demo`` runs it (``python -m flows.async_rl``), the others
  as ``rollflow run``; all of the output is checked, so the first 40 lines a demo shows are too. They all take the suite's tiny model
  (``runs/models/tiny``) instead of building their own (a warm start takes a minute or more each);
  ``tiny_vllm`` runs on the local backend (vLLM is the GPU-less part it cannot check here);
- the GPU configs (hub models and data, S3): ``rollflow plan``, which resolves and checks the config as
  the GPU deployments run it;
- ``configs/tiny_cpu.yaml``: ``tests/flows/test_demo_output.py`` runs it as ``make demo DEMO_CONFIG=...``
  and checks the same.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ["train.steps=1", "eval.n_prompts=8", "train.batch_size=4", "rollout.group_size=4"]
# config -> (the command's first words, extra overrides): a run of one step, or the GPU plan
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "tiny_hard.yaml": (["-m", "flows.async_rl"], RUN),  # the Makefile's demo command
    "tiny_hard2.yaml": (["-m", "flows.cli", "run"], RUN),
    "tiny_agent.yaml": (["-m", "flows.cli", "run"], RUN),
    "tiny_vllm.yaml": (["-m", "flows.cli", "run"], [*RUN, "inference.backend=local"]),
    "gsm8k_qwen.yaml": (["-m", "flows.cli", "plan"], ["--image", "registry.example/rollflow:gpu"]),
    "qwen_1node.yaml": (["-m", "flows.cli", "plan"], ["--image", "registry.example/rollflow:gpu"]),
}
ELSEWHERE = {"tiny_cpu.yaml": "tests/flows/test_demo_output.py"}
NOISE = re.compile(r"\bWARNING\b|Traceback|\bwarn(ing)?s?\.warn|UserWarning|DeprecationWarning|FutureWarning")


def test_every_shipped_config_is_checked() -> None:
    shipped = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted([*COMMANDS, *ELSEWHERE]) == shipped
    assert "no WARNING" in (ROOT / ELSEWHERE["tiny_cpu.yaml"]).read_text()


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from rollflow.configuration.loader import load_config
    from rollflow.models.bootstrap import bootstrap_for

    cfg = load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"model.path={ROOT / 'runs/models/tiny'}"])
    return Path(bootstrap_for(cfg)).resolve()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_shipped_config_prints_no_warning_and_no_traceback(
    name: str, tiny_model: Path, prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    words, extra = COMMANDS[name]
    cmd = [sys.executable, *words, "--config", f"configs/{name}", *extra]
    if "plan" not in words:
        cmd += [
            f"model.path={tiny_model}", "model.bootstrap_tiny=false", f"storage.root={tmp_path / 'storage'}",
            f"storage.local_cache={tmp_path / 'cache'}", f"tracking.mlflow_tracking_uri=sqlite:///{tmp_path / 'm.db'}",
        ]  # fmt: skip
    env = {**prefect_env, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )
    out = res.stdout
    assert res.returncode == 0, out[-5000:]
    noisy = [line for line in out.splitlines() if NOISE.search(line)]
    assert not noisy, "\n".join(noisy)
    if "plan" not in words:
        assert "eval_accuracy_after" in out, out[-3000:]  # it ran to its summary
