"""The local state directories a run needs, made before Prefect reads its settings.

What it is: ``ensure_state_dirs()`` creates ``$PREFECT_HOME`` (with its parents) when it is set.
Prefect 3.8 makes its home with a single-level ``mkdir`` when ``prefect`` is first imported; under a
directory that does not exist yet (``runs/prefect`` in a fresh clone) that fails with only a warning, and
the local API server then dies on ``sqlite3.OperationalError: unable to open database file``. The
``flows`` and ``tasks`` packages call it in their ``__init__``, before any of their modules imports
``prefect``, so every way of starting a run (``make demo``, ``python -m flows.async_rl``, ``rollflow run``,
the notebook, a deployment's flow-run process) finds its Prefect home in place.
What it is not: the directories of storage and MLflow (``storage.fs`` and ``tracking.mlflow_tracker``
create theirs when they open them), and nothing here imports Prefect (``rollflow/`` never does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class StateDirError(RuntimeError):
    """A state directory named by the environment cannot be created."""


def ensure_state_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Create the state directories named in ``environ`` (default ``os.environ``); return them.

    Raises ``StateDirError`` naming the variable when one cannot be made (a file in the way, no
    permission), so the failure says what to change instead of surfacing later as a SQLite error."""
    env = os.environ if environ is None else environ
    made: list[Path] = []
    home = env.get("PREFECT_HOME")
    if home:
        path = Path(home).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateDirError(
                f"PREFECT_HOME={home!r} cannot be created ({e.strerror or e}); "
                "point PREFECT_HOME at a writable directory or unset it"
            ) from e
        made.append(path)
    return made
