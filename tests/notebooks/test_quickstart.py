"""notebooks/quickstart.ipynb runs end to end (nbclient) and is committed with outputs stripped."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


def test_notebook_is_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "strip outputs before committing"
    assert nb.metadata["kernelspec"]["language"] == "python"


@pytest.mark.slow
def test_notebook_executes(use_prefect_server: str, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {
        "ROLLFLOW_PROJECT_DIR": str(ROOT),
        "ROLLFLOW_NB_STEPS": "6",
        "ROLLFLOW_NB_RUNS": str(tmp_path / "runs"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PREFECT_API_URL": use_prefect_server,
        # no such deployment on this server: the notebook falls back to the embedded flow
        # (tests/flows/test_user_day.py drives the deployment branch with a worker)
        "ROLLFLOW_NB_DEPLOYMENT": "async-rl/not-deployed",
    }
    NotebookClient(  # the kernel gets the notebook's parameters in its environment
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute(env={**os.environ, **env})
    outputs = "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("name") == "stdout"
    )
    assert "embedded run of trial demo-" in outputs and "final version 6" in outputs
    # the Python API ran with the reward defined in the notebook: it scored every trained completion there
    import re

    scored = re.search(r"\((\d+) completions scored in this kernel\)", outputs)
    assert scored and int(scored.group(1)) >= 6 * 16 * 8, outputs[-2000:]
    # the cell labelled "accuracy before" prints the base policy's score (v0), not the final one (issue 21)
    from mlflow.tracking import MlflowClient

    m = re.search(r"MLflow run (\w+) ", outputs)
    labelled = re.search(r"accuracy before (\d\.\d{3}) \(v(\d+)\), after (\d\.\d{3}) \(v(\d+)\);", outputs)
    assert m and labelled, outputs
    history = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_metric_history(m.group(1), "eval/accuracy")
    by_step = {h.step: h.value for h in history}
    assert labelled.group(2) == "0" and float(labelled.group(1)) == round(by_step[0], 3), (
        labelled[0],
        by_step,
    )
    assert labelled.group(4) == "6" and float(labelled.group(3)) == round(by_step[6], 3), (
        labelled[0],
        by_step,
    )
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert len(images) >= 2, "the curves and the timeline were not both rendered inline"
    assert '"time/trainer/computing_frac"' in outputs  # where the time went, from the run's metrics
    last = nb.cells[-1].outputs
    assert last and "text/html" in last[0].get("data", {}), "the trajectories table was not displayed"
