"""The README's code runs: every block marked ``<!-- runnable -->`` (Python or shell) is run, in order, as
a newcomer would, on a fresh trial in a fresh project directory.

The Python blocks run in one fresh interpreter (a script made of them), the shell blocks with ``bash -e``
and the project's ``.venv/bin`` on ``PATH``, each in a temporary project directory (``runs/`` there;
``ROLLFLOW_PROJECT_DIR`` points the CLI at it) against the session's Prefect server. The one change: the
example's ``"train.steps": N`` becomes ``README_TRAIN_STEPS`` (default 4), so CI spends seconds, not
minutes; the tiny model the example would build is linked from the one the suite builds once.
``make demo`` itself is not run here: CI runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)
STEPS = re.compile(r'"train\.steps": \d+')


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block right after a runnable marker, in order."""
    blocks = []
    for part in text.split(MARKER)[1:]:
        m = FENCE.match(part.lstrip("\n"))
        assert m, f"a {MARKER} marker must stand right before a fenced block: {part[:80]!r}"
        blocks.append((m.group(1) or "sh", m.group(2)))
    return blocks


def test_the_markers_find_the_python_example_and_a_shell_block() -> None:
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    kinds = [lang for lang, _ in blocks]
    assert "python" in kinds and "sh" in kinds, kinds
    (example,) = [code for lang, code in blocks if lang == "python"]
    assert "RLRun(" in example and len(STEPS.findall(example)) == 1  # the one line the test shortens
    assert "rows = " in example and "def exact(" in example  # nothing is left for the reader to define


@pytest.mark.slow
def test_the_readme_blocks_run_on_a_fresh_trial(
    use_prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    from rollflow.configuration.loader import load_config
    from rollflow.models.bootstrap import bootstrap_for

    tiny = bootstrap_for(
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"model.path={ROOT / 'runs/models/tiny'}"])
    )
    project = tmp_path / "project"
    (project / "runs" / "models").mkdir(parents=True)
    (project / "runs" / "models" / "tiny").symlink_to(Path(tiny).resolve(), target_is_directory=True)
    steps = int(os.environ.get("README_TRAIN_STEPS", "4"))
    env = {
        **prefect_env,
        "PREFECT_API_URL": use_prefect_server,
        "ROLLFLOW_PROJECT_DIR": str(project),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("MLFLOW_TRACKING_URI", None)  # the example's default store: runs/mlflow under the project
    for i, (lang, code) in enumerate(runnable_blocks((ROOT / "README.md").read_text())):
        if lang == "python":
            code = STEPS.sub(f'"train.steps": {steps}', code)
            cmd = [sys.executable, "-c", code]
        else:
            cmd = ["bash", "-e", "-c", code]
        res = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=540)
        out = res.stdout + res.stderr
        (tmp_path / f"block{i}.log").write_text(out)
        assert res.returncode == 0, f"README block {i} ({lang}) failed:\n{out[-4000:]}"
        if lang == "python":
            assert " -> " in res.stdout and "completion" in res.stdout, res.stdout[-2000:]
        else:
            assert "rlrun-tiny" in res.stdout and "1 trial(s)" in res.stdout, res.stdout
