"""The metrics sink: one small interface every loop reports through.

What it is: ``MetricsSink`` (a one-method Protocol), ``InMemorySink`` for tests and notebooks, and
``NullSink``. The MLflow sink is ``rollflow.tracking.mlflow_tracker.MlflowSink``, built by tasks/ and
flows/ and handed to the loops as a ``MetricsSink``: ``rollflow/tracking/`` is the only package of
rollflow that imports mlflow, and no module of rollflow imports prefect (``tests/test_layering.py``
holds both).
What it is not: aggregation or step bookkeeping; callers pass the step (a policy version or a counter).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Protocol, runtime_checkable


@runtime_checkable
class MetricsSink(Protocol):
    def log(self, metrics: dict[str, float], step: int | None = None) -> None: ...


class NullSink:
    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        return None


class InMemorySink:
    """Thread-safe; keeps every (step, value) per metric name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.history: dict[str, list[tuple[int | None, float]]] = defaultdict(list)

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        with self._lock:
            for name, value in metrics.items():
                self.history[name].append((step, float(value)))

    def last(self, name: str) -> float | None:
        with self._lock:
            values = self.history.get(name)
            return values[-1][1] if values else None

    def values(self, name: str) -> list[float]:
        with self._lock:
            return [v for _, v in self.history.get(name, [])]


class PrefixSink:
    """A ``MetricsSink`` that namespaces every metric of one loop (``loss`` -> ``train/loss``) on its way to
    the run's sink, so ``train/``, ``rollout/`` and ``eval/`` never collide. Every metric is forwarded."""

    def __init__(self, inner: MetricsSink | None, prefix: str) -> None:
        self.inner: MetricsSink = inner if inner is not None else NullSink()
        self.prefix = prefix

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log({self.prefix + k: v for k, v in metrics.items()}, step=step)
