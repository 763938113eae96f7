"""Task-side tracking glue: MLflow sinks per loop and Prefect artifacts (progress, tables, summary).

What it is: small adapters so the core's ``MetricsSink`` calls reach MLflow with a namespace
(``train/``, ``rollout/``, ``eval/``) and, for the trainer, also move a Prefect progress artifact.
What it is not: MLflow logic (rollflow/tracking) or metric computation (the loops).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

from rollflow.api.metrics import MetricsSink, NullSink

log = logging.getLogger(__name__)


class PrefixSink:
    """Forward to ``inner`` with every metric name prefixed (``loss`` -> ``train/loss``)."""

    def __init__(self, inner: MetricsSink | None, prefix: str) -> None:
        self.inner: MetricsSink = inner if inner is not None else NullSink()
        self.prefix = prefix

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log({self.prefix + k: v for k, v in metrics.items()}, step=step)


class ProgressSink:
    """Forward metrics and move a Prefect progress artifact to ``step / total`` at milestones.

    The artifact moves only when progress crosses the next ``milestone_pct`` boundary (10 %, 20 %, ...)
    and at the last step: each update is an event that ``prefect deployment run --watch`` prints, so a
    100-step run shows 10 lines instead of 100."""

    def __init__(
        self,
        inner: MetricsSink,
        total_steps: int,
        key: str = "train-progress",
        *,
        milestone_pct: float = 10.0,
        publish: Callable[[float], None] | None = None,
    ) -> None:
        self.inner = inner
        self.total = max(1, total_steps)
        self.key = key
        self.milestone_pct = milestone_pct
        self._publish = publish or self._prefect_publish
        self._artifact: UUID | None = None
        self._shown = -1.0  # progress last published
        self._lock = threading.Lock()

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log(metrics, step=step)
        if step is None:
            return
        progress = min(100.0, 100.0 * step / self.total)
        with self._lock:
            crossed = progress // self.milestone_pct > self._shown // self.milestone_pct
            if not crossed and not (progress >= 100.0 > self._shown):
                return
            self._shown = progress
        try:
            self._publish(progress)
        except Exception as exc:  # the UI nicety must never stop training
            log.debug("progress artifact update failed: %s", exc)

    def _prefect_publish(self, progress: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        with self._lock:
            if self._artifact is None:
                self._artifact = create_progress_artifact(
                    progress, key=self.key, description="training steps done / planned"
                )
            else:
                update_progress_artifact(self._artifact, progress)


def table_artifact(rows: list[dict[str, Any]], key: str, description: str) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(rows, key=key, description=description)


def markdown_artifact(markdown: str, key: str, description: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key=key, description=description)
