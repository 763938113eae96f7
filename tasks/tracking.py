"""Task-side tracking glue: MLflow sinks per loop and Prefect artifacts (tables, markdown).

What it is: small adapters so the core's ``MetricsSink`` calls reach MLflow with a namespace
(``train/``, ``rollout/``, ``eval/``), and one-call Prefect table and markdown artifacts under a key
(a run creates each key once; Prefect keeps a new version of a key per run).
What it is not: MLflow logic (rollflow/tracking), metric computation (the loops), or the progress
people watch (``tasks/progress.py``: the 10 % lines, the bar and the progress artifact updated in place).
"""

from __future__ import annotations

from typing import Any

from rollflow.api.metrics import MetricsSink, NullSink


class PrefixSink:
    """Forward to ``inner`` with every metric name prefixed (``loss`` -> ``train/loss``)."""

    def __init__(self, inner: MetricsSink | None, prefix: str) -> None:
        self.inner: MetricsSink = inner if inner is not None else NullSink()
        self.prefix = prefix

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log({self.prefix + k: v for k, v in metrics.items()}, step=step)


def table_artifact(rows: list[dict[str, Any]], key: str, description: str) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(rows, key=key, description=description)


def markdown_artifact(markdown: str, key: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key=key, description=description)
