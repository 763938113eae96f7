"""``PrefixSink``: a ``MetricsSink`` that namespaces every metric of one loop (``loss`` -> ``train/loss``).

What it is: the adapter each loop's metrics go through on their way to the run's sink (MLflow, or the
progress sink in front of it), so ``train/``, ``rollout/`` and ``eval/`` never collide.
What it is not: a store (``rollflow.tracking.mlflow_tracker``) or a filter: every metric is forwarded.
"""

from __future__ import annotations

from rollflow.api.metrics import MetricsSink, NullSink


class PrefixSink:
    """Forward to ``inner`` with every metric name prefixed (``loss`` -> ``train/loss``)."""

    def __init__(self, inner: MetricsSink | None, prefix: str) -> None:
        self.inner: MetricsSink = inner if inner is not None else NullSink()
        self.prefix = prefix

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log({self.prefix + k: v for k, v in metrics.items()}, step=step)
