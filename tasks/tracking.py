"""Task-side tracking glue: Prefect artifacts (tables, markdown).

What it is: one-call Prefect table and markdown artifacts under a key (a run creates each key once;
Prefect keeps a new version of a key per run). The per-loop metric namespace (``train/``, ``rollout/``,
``eval/``) is ``rollflow.api.metrics.PrefixSink``.
What it is not: MLflow logic (rollflow/tracking), metric computation (the loops), or the progress
people watch (``tasks/progress.py``: the 10 % lines, the bar and the progress artifact updated in place).
"""

from __future__ import annotations

from typing import Any


def table_artifact(rows: list[dict[str, Any]], key: str, description: str) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(rows, key=key, description=description)


def markdown_artifact(markdown: str, key: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key=key, description=description)
