"""Where ``runs/`` is: the project directory, the one rule ``RLRun`` and the ``rollflow`` command share.

What it is: ``project_dir()`` and the ``in_project()`` context in which a run resolves every relative path
of its config (``storage.root: runs/storage``, ``model.path: runs/models/tiny``, the MLflow file
``runs/mlflow/mlflow.db``, ``RLRun``'s ``runs/datasets/``). The rule, as MLflow's ``./mlruns`` and
Hydra's ``outputs/`` have it:

1. ``$ROLLFLOW_PROJECT_DIR`` when it is set (a worker, a deployment, a notebook kept elsewhere);
2. else the current directory.

So a trial made by a script in ``~/proj`` is listed, queried and resumed by ``rollflow ls``, ``query``
and ``resume`` typed in ``~/proj``; the demo's (``make demo`` runs in the checkout) from the checkout.
``runs_hint()`` is the sentence a "trial not found" error ends with: where it looked, and how to look
elsewhere. What it is not: where a config *file* is found (``flows/cli/paths.py``'s ``find_config`` also
looks in the checkout, so the shipped configs work from anywhere), nor storage itself: an absolute or
``s3://`` root is used as it is.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PROJECT_DIR_ENV = "ROLLFLOW_PROJECT_DIR"


def project_dir() -> Path:
    """``$ROLLFLOW_PROJECT_DIR`` (absolute) when set, else the current directory (module docstring)."""
    given = os.environ.get(PROJECT_DIR_ENV)
    return Path(given).expanduser().resolve() if given else Path.cwd()


@contextlib.contextmanager
def in_dir(folder: Path) -> Iterator[None]:
    """Run with ``folder`` as the working directory; put the old one back after."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def in_project() -> contextlib.AbstractContextManager[None]:
    """Run in ``project_dir()``, so the config's relative paths resolve there (a no-op when it is here)."""
    return in_dir(project_dir())


def runs_hint(root: str) -> str:
    """What a "trial not found" error adds for a relative storage ``root``: the directory it was resolved
    in and how to point there ('' for an absolute or remote root, which the error names already)."""
    if "://" in root or Path(root).expanduser().is_absolute():
        return ""
    return (
        f" ({root} is resolved in {project_dir()}: run the command in the directory the trial was "
        f"started in, or set {PROJECT_DIR_ENV} to it)"
    )
