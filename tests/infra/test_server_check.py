"""``python -m infra.server_check``, the check the GPU image's docs run after a build, run here exactly as its
docstring prints it: one real SGLang server (its CPU path, ``.venv-sglang``) started by the flow's launcher,
a batch generated with logprobs and versions, the server stopped."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # SGLang's CPU server takes 30-40 s to start

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_server_check_starts_sglang_and_generates() -> None:
    import infra.server_check as mod

    printed = re.search(r"^\s+(python -m infra\.server_check --config .+)$", mod.__doc__ or "", re.M)
    assert printed, "the module docstring prints the command"
    argv = shlex.split(printed.group(1))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    res = subprocess.run(
        [sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    lines = dict(ln.split(" ", 1) for ln in res.stdout.splitlines() if " " in ln)
    assert lines["backend"] == "sglang" and float(lines["tokens"]) == 32
    assert res.stdout.rstrip().endswith("server_check: ok")
    assert "Unclosed" not in res.stderr and "Traceback" not in res.stderr
