"""What a person watching a run reads: a line per 10 % of training, a bar on a terminal, a progress artifact.

What it is: ``RunProgress``, a ``MetricsSink`` that forwards every metric unchanged (to MLflow) and
watches a few go by: the trainer's ``train/*`` (one dict per step, with ``train/version``,
``train/reward_mean``, ``train/staleness_mean`` and ``train/seqs``) and the evaluations' ``eval/accuracy``
with its retention split (``eval/accuracy_base_solved`` / ``eval/accuracy_base_unsolved``: held-out problems
the starting policy solved / did not).
Each time training crosses the next ``milestone_pct`` of ``train.steps``
(10 %, 20 %, ... and the last step) it

- says one line (the flow's run logger), e.g.::

      progress 30/100 (30%): reward 0.521, held-out accuracy 0.585 (v20; base-solved 0.900, base-unsolved 0.480), 671 completions/s, staleness 1.3, 21 s

  where reward and staleness (the version lag of the groups trained) are means over the steps since the
  previous line, the accuracy is the newest evaluation and the version it scored (with the accuracy on
  the problems the starting policy solved, which falls when the policy forgets, and on those it did
  not, which rises as it learns), completions/s is the
  completions trained per second since the previous line (what the rollout generates, in the steady state
  the staleness bound keeps: what is generated beyond it waits), and the last figure is the seconds since this object was made (the
  embedded flow makes it once its servers are up); a value not seen yet is left out. A 100-step run says
  10 lines; a resumed one says its first where it resumed;
- moves the Prefect progress artifact ``train-progress`` to step / total: one artifact, created at the
  first step and updated in place (each update is a ``prefect.artifact.updated`` event, which
  ``prefect deployment run --watch`` prints).

When ``bar_stream`` is a terminal (by default: stdout, when it is one and tqdm is installed) a bar moves
at every step, and while it is up a console log record first clears it, so a line never lands in the
middle of the bar (the bar is drawn again at the next step).

What it is not: a metrics store (MLflow is) or the per-step log (the trainer's DEBUG lines, ``-v``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TextIO
from uuid import UUID

from rollflow.api.metrics import MetricsSink, NullSink

if TYPE_CHECKING:
    from tqdm import tqdm  # optional: no bar without it

log = logging.getLogger(__name__)


class _ClearBarFirst(logging.Filter):
    """On a console handler: clear the bar before the record is written (tqdm redraws it at its next update)."""

    def __init__(self, bar: tqdm) -> None:
        super().__init__()
        self.bar = bar

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # a cosmetic step must never drop a log record
            self.bar.clear()
        return True


def _console_handlers() -> list[logging.Handler]:
    """The stream handlers that write to the terminal: root's (Prefect's console) and ``prefect``'s."""
    return [
        h
        for name in ("", "prefect")
        for h in logging.getLogger(name).handlers
        if isinstance(h, logging.StreamHandler)
    ]


class RunProgress:
    """See the module docstring. Thread-safe: the trainer, rollout and eval loops log into it at once."""

    def __init__(
        self,
        inner: MetricsSink | None,
        total_steps: int,
        *,
        say: Callable[[str], None] | None = None,
        key: str = "train-progress",
        milestone_pct: float = 10.0,
        publish: Callable[[float], None] | None = None,
        bar_stream: TextIO | Literal["stdout"] | None = "stdout",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner: MetricsSink = inner if inner is not None else NullSink()
        self.total = max(1, int(total_steps))
        self.say = say or log.info
        self.key = key
        self.milestone_pct = milestone_pct
        self._publish = publish or self._prefect_publish
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._artifact_lock = threading.Lock()
        self._artifact: UUID | None = None
        self._published = False
        self._bucket = 0  # the last milestone said (0: none yet)
        self._reward: list[float] = []  # since the last line
        self._staleness: list[float] = []
        self._seqs = 0.0
        self._t_line = self._t0  # when the previous line was said
        self._accuracy: tuple[float, int | None] | None = None
        self._retention: dict[str, float] = {}  # the newest evaluation's base-solved / base-unsolved
        self._last_reward: float | None = None  # for the bar
        stream = sys.stdout if bar_stream == "stdout" else bar_stream
        self._bar = self._make_bar(stream) if stream is not None else None
        self._filter: _ClearBarFirst | None = None
        if self._bar is not None:
            self._filter = _ClearBarFirst(self._bar)
            for h in _console_handlers():
                h.addFilter(self._filter)

    # --- MetricsSink ----------------------------------------------------------------------------------------

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.inner.log(metrics, step=step)
        try:
            self._observe(metrics, step)
        except Exception as exc:  # noqa: BLE001 (what people read must never stop training)
            log.debug("progress report failed: %s", exc)

    # --- internals ------------------------------------------------------------------------------------------

    def _observe(self, metrics: dict[str, float], step: int | None) -> None:
        line, publish_at, version = None, None, None
        with self._lock:
            if "eval/accuracy" in metrics:
                self._accuracy = (float(metrics["eval/accuracy"]), step)
                self._retention = {
                    name: float(metrics[f"eval/accuracy_base_{name}"])
                    for name in ("solved", "unsolved")
                    if f"eval/accuracy_base_{name}" in metrics
                }
            if "train/version" not in metrics:
                return
            version = int(metrics["train/version"])
            if "train/reward_mean" in metrics:
                self._last_reward = float(metrics["train/reward_mean"])
                self._reward.append(self._last_reward)
            if "train/staleness_mean" in metrics:
                self._staleness.append(float(metrics["train/staleness_mean"]))
            self._seqs += float(metrics.get("train/seqs", 0.0))
            progress = min(100.0, 100.0 * version / self.total)
            bucket = int(progress // self.milestone_pct)
            if bucket > self._bucket:
                self._bucket = bucket
                line = self._line(version)
                self._reward, self._staleness, self._seqs = [], [], 0.0
            if line is not None or not self._published:
                self._published = True
                publish_at = progress
        self._move_bar(version)
        if line is not None:
            self.say(line)
        if publish_at is not None:
            try:
                self._publish(publish_at)
            except Exception as exc:  # noqa: BLE001 (the UI nicety must never stop training)
                log.debug("progress artifact update failed: %s", exc)

    def _line(self, version: int) -> str:
        now = self._clock()
        fields = []
        if self._reward:
            fields.append(f"reward {sum(self._reward) / len(self._reward):.3f}")
        if self._accuracy is not None:
            acc, at = self._accuracy
            notes = [f"v{at}"] if at is not None else []
            notes += (
                [", ".join(f"base-{k} {v:.3f}" for k, v in self._retention.items())]
                if self._retention
                else []
            )
            fields.append(f"held-out accuracy {acc:.3f}" + (f" ({'; '.join(notes)})" if notes else ""))
        if self._seqs > 0 and now > self._t_line:
            fields.append(f"{self._seqs / (now - self._t_line):.0f} completions/s")
        self._t_line = now
        if self._staleness:
            fields.append(f"staleness {sum(self._staleness) / len(self._staleness):.1f}")
        fields.append(f"{now - self._t0:.0f} s")
        pct = 100.0 * version / self.total
        return f"progress {version}/{self.total} ({pct:.0f}%): " + ", ".join(fields)

    def _make_bar(self, stream: TextIO) -> tqdm | None:
        isatty = getattr(stream, "isatty", None)
        if isatty is None or not isatty():
            return None
        try:
            from tqdm import tqdm
        except ImportError:  # not a dependency of ours: no bar, the lines still come
            return None
        return tqdm(
            total=self.total, file=stream, unit="step", desc="training", leave=False, dynamic_ncols=True
        )

    def _move_bar(self, version: int) -> None:
        bar = self._bar
        if bar is None:
            return
        try:
            with self._lock:
                reward = self._last_reward
                acc = self._accuracy
            bar.n = min(version, self.total)
            post = [f"reward {reward:.2f}"] if reward is not None else []
            post += [f"acc {acc[0]:.3f}"] if acc is not None else []
            bar.set_postfix_str(", ".join(post), refresh=False)
            bar.refresh()
        except Exception as exc:  # noqa: BLE001
            log.debug("progress bar update failed: %s", exc)

    def _prefect_publish(self, progress: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        with self._artifact_lock:
            if self._artifact is None:
                self._artifact = create_progress_artifact(
                    progress, key=self.key, description="training steps done / planned"
                )
            else:
                update_progress_artifact(self._artifact, progress)

    def close(self) -> None:
        """Take the bar down and its console filters off (idempotent)."""
        if self._filter is not None:
            for h in _console_handlers():
                h.removeFilter(self._filter)
            self._filter = None
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()
