"""A run's Prefect home under a directory that does not exist yet (a fresh clone's ``runs/prefect``).

The subprocess imports ``flows`` as every entry point does (``make demo``, ``rollflow run``, the notebook),
starts the private Prefect API on that home and runs a flow through it: before the fix the API server died
on ``sqlite3.OperationalError: unable to open database file``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollflow.configuration.state_dirs import StateDirError, ensure_state_dirs

ROOT = Path(__file__).resolve().parents[2]

FLOW_IN_A_FRESH_HOME = """
import flows  # makes $PREFECT_HOME before prefect is imported
from prefect import flow
from flows.local_api import local_prefect_api

@flow(name="fresh-home")
def hello(x: int) -> int:
    return x + 1

with local_prefect_api() as url:
    assert url is not None
    print("RESULT", hello(41))
"""


@pytest.mark.timeout(400)
def test_a_flow_runs_with_prefect_home_under_a_missing_directory(tmp_path: Path) -> None:
    home = tmp_path / "clone" / "runs" / "prefect"  # neither runs/ nor clone/ exists
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="true")
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", FLOW_IN_A_FRESH_HOME], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=380,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "RESULT 42" in out.stdout
    assert "Failed to create the Prefect home" not in out.stderr
    # the run's queued logs went to the API before it stopped (left to Prefect's exit hook, they were retried
    # against the stopped server for ~80 s, then reported as "Error logging to API")
    assert "Error logging to API" not in out.stdout + out.stderr
    assert any(home.glob("*.db")), sorted(p.name for p in home.iterdir())  # the API's SQLite file is there


def test_ensure_state_dirs_makes_parents_and_says_what_is_wrong(tmp_path: Path) -> None:
    home = tmp_path / "a" / "b" / "prefect"
    assert ensure_state_dirs({"PREFECT_HOME": str(home)}) == [home]
    assert home.is_dir()
    assert ensure_state_dirs({}) == []  # unset: Prefect's default (~/.prefect) is Prefect's business
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StateDirError, match="PREFECT_HOME=.*writable directory"):
        ensure_state_dirs({"PREFECT_HOME": str(blocker / "prefect")})
