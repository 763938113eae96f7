"""notebooks/quickstart.ipynb: committed with clean outputs, driven by ``RLRun`` only, and it runs top to
bottom (nbclient, a real kernel, the session's Prefect server, a fresh project directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
STEPS = re.compile(r"^STEPS = \d+", re.MULTILINE)
NOISE = ("\x1b[", "IProgress", "never awaited", "Traceback", "| INFO ", "| WARNING ")


def _texts(nb: nbformat.NotebookNode) -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
            out.append(o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values()))
    return out


def test_the_notebook_uses_the_public_api_and_is_committed_with_clean_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert (
        "RLRun(" in code
        and "run.train()" in code
        and "run.evaluate()" in code
        and "run.trajectories(" in code
    )
    imports = re.findall(r"^(?:from|import) (\S+)", code, re.MULTILINE)
    assert {m.split(".")[0] for m in imports} <= {
        "os",
        "warnings",
        "pathlib",
        "flows",
        "matplotlib",
        "mlflow",
    }, imports
    assert "ROLLFLOW_NB_" not in code  # no test-only switches in what a reader runs
    assert len(STEPS.findall(code)) == 1
    texts = _texts(nb)
    assert texts, "commit the notebook with its outputs, so a reader sees the curves without running it"
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    for noise in NOISE:
        assert not any(noise in t for t in texts), f"{noise!r} in the saved outputs"
    html = [t for t in texts if "<table" in t or "<div" in t]
    assert len(html) == 1, "one HTML output (the trajectories table), no HTML log lines"
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert any(re.search(r"held-out accuracy 0\.\d{3} -> [01]\.\d{3}", t) for t in texts)


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom(
    use_prefect_server: str, prefect_env: dict[str, str], tmp_path: Path
) -> None:
    from nbclient import NotebookClient

    from rollflow.configuration.loader import load_config
    from rollflow.models.bootstrap import bootstrap_for

    tiny = bootstrap_for(
        load_config(ROOT / "configs" / "tiny_cpu.yaml", [f"model.path={ROOT / 'runs/models/tiny'}"])
    )
    (tmp_path / "runs" / "models").mkdir(parents=True)
    (tmp_path / "runs" / "models" / "tiny").symlink_to(Path(tiny).resolve(), target_is_directory=True)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        cell.source = STEPS.sub("STEPS = 6", cell.source) if cell.cell_type == "code" else cell.source
    env = {**os.environ, **prefect_env, "PREFECT_API_URL": use_prefect_server}
    env.pop("MLFLOW_TRACKING_URI", None)  # the notebook's default store, under the project's runs/
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute(env=env)
    texts = _texts(nb)
    joined = "\n".join(texts)
    assert "final version 6" in joined and "(experiment rlrun-tiny)" in joined, joined[-3000:]
    assert re.search(r"version 6: accuracy [01]\.\d{3}", joined), joined[-3000:]
    for noise in NOISE[:4]:  # a warning may show (it is one); colour codes and tracebacks may not
        assert noise not in joined, f"{noise!r} in the outputs"
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    last = nb.cells[-1].outputs
    assert last and "<table" in str(last[-1].get("data", {})), "the trajectories table was not displayed"
