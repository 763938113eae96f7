"""Sample the cores, the servers and the role clocks while a run goes, and log them as ``time/...`` metrics.

What it is: ``TimingReporter(timeline, sink, addresses=..., pids=...)``, a daemon thread that every
``interval_s`` seconds reads ``CoreMeter``, ``ServerMeter`` and ``ProcessMeter``, stores the reading in the
timeline (``Timeline.add_sample``, drawn by ``plot``) and logs, at step = the newest policy version:

- ``time/{role}/{state}_frac`` and ``time/{role}/wall_s`` (``Timeline.metrics``);
- ``time/cpu/core{i}_busy_frac`` (since the reporter started), ``time/cpu/busy_frac_min`` and ``_mean``;
- ``time/server{j}/busy_frac``, ``time/server{j}/avg_batch``, ``time/server{j}/occupancy`` (since start);
- ``time/proc/{name}_cores`` (cores used by a named process over the last interval).

``stop()`` takes a last reading and returns the final figures; ``bounds(figures)`` says in one line which
role waits for which.
What it is not: the clocks themselves (``rollflow.clock.roles``) or the picture (``plot``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.clock.roles import Timeline
from rollflow.inference.server_meter import ServerMeter
from rollflow.timing.cpu import CoreMeter, ProcessMeter

logger = logging.getLogger(__name__)


class TimingReporter:
    """See the module docstring."""

    def __init__(
        self,
        timeline: Timeline,
        sink: MetricsSink | None = None,
        *,
        addresses: Sequence[str] = (),
        api_key: str | None = None,
        pids: dict[str, int] | None = None,
        interval_s: float = 5.0,
    ) -> None:
        self.timeline = timeline
        self.sink = sink or NullSink()
        self.addresses = list(addresses)
        self.interval_s = interval_s
        self.cores = CoreMeter()
        self.servers = ServerMeter(self.addresses, api_key=api_key)
        self.procs = ProcessMeter(pids or {})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._final: dict[str, float] | None = None
        self._lock = threading.Lock()

    def start(self) -> TimingReporter:
        self._thread = threading.Thread(target=self._run, name="timing-reporter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 (accounting must never stop a run)
                logger.exception("timing sample failed")

    def tick(self) -> dict[str, float]:
        """Take one reading, store it, log and return the figures."""
        with self._lock:
            cores = self.cores.sample()
            servers = self.servers.sample()
            procs = self.procs.sample()
            self.timeline.add_sample(
                {
                    "t": round(self.timeline.now(), 3),
                    "cores": {str(c): round(f, 4) for c, f in cores.items()},
                    "servers": {a: {k: round(v, 4) for k, v in f.items()} for a, f in servers.items()},
                    "processes": {n: round(v, 4) for n, v in procs.items()},
                }
            )
            figures = self.figures(procs)
        self.sink.log(figures, step=self.timeline.version)
        return figures

    def figures(self, procs: dict[str, float] | None = None) -> dict[str, float]:
        """The ``time/...`` metrics so far (see the module docstring)."""
        out = self.timeline.metrics()
        busy = self.cores.since_start()
        for core, frac in busy.items():
            out[f"time/cpu/core{core}_busy_frac"] = frac
        if busy:
            out["time/cpu/busy_frac_min"] = min(busy.values())
            out["time/cpu/busy_frac_mean"] = sum(busy.values()) / len(busy)
        since = self.servers.since_start()
        for j, address in enumerate(self.addresses):
            for key, value in since.get(address, {}).items():
                out[f"time/server{j}/{key}"] = value
        for name, cores in (procs or {}).items():
            out[f"time/proc/{name}_cores"] = cores
        return out

    def stop(self) -> dict[str, float]:
        """Stop sampling; one last reading; the final figures (a second call returns the same)."""
        if self._final is not None:
            return self._final
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        try:
            self._final = self.tick()
        except Exception:  # noqa: BLE001
            logger.exception("final timing sample failed")
            self._final = self.figures()
        return self._final


# The rollout's other named waits (rollflow.clock.roles), as ``bounds`` words them.
ROLLOUT_WAITS = (
    ("flush_wait", "committing its buffer"),
    ("claim_wait", "held by the claim gate"),
    ("paused", "paused for a weight load"),
    ("exhausted", "out of prompts"),
    ("idle", "idle"),
)


def bounds(figures: dict[str, float]) -> str:
    """One line saying where the time went and which role waits for which (from ``figures``)."""
    parts = []
    wait = figures.get("time/trainer/waiting_data_frac")
    comp = figures.get("time/trainer/computing_frac")
    gen = figures.get("time/rollout/generating_frac")
    cap = figures.get("time/rollout/capacity_wait_frac")
    if wait is not None and comp is not None:
        parts.append(f"trainer computing {comp:.0%}, waiting for data {wait:.0%}")
    if gen is not None and cap is not None:
        waits = "".join(
            f", {label} {figures[f'time/rollout/{state}_frac']:.0%}"
            for state, label in ROLLOUT_WAITS
            if figures.get(f"time/rollout/{state}_frac", 0.0) >= 0.005
        )
        parts.append(f"rollout generating {gen:.0%}, held by the staleness bound {cap:.0%}{waits}")
    cores = sorted((k, v) for k, v in figures.items() if k.startswith("time/cpu/core"))
    if cores:
        parts.append("cores busy " + ", ".join(f"{v:.0%}" for _, v in cores))
    servers = sorted(
        (k, v) for k, v in figures.items() if k.startswith("time/server") and k.endswith("busy_frac")
    )
    if servers:
        parts.append("servers busy " + ", ".join(f"{v:.0%}" for _, v in servers))
    verdict = ""
    if wait is not None and cap is not None:
        if wait > 0.1 and wait >= cap:
            verdict = "generation bounds the run (the trainer waits for rollouts)"
        elif cap > 0.1:
            verdict = "training bounds the run (the rollout waits for the trainer's versions)"
        else:
            verdict = "neither side waits for long"
    if cores and min(v for _, v in cores) >= 0.9:
        verdict += ("; " if verdict else "") + "every core is busy: more overlap needs more cores"
    return "; ".join(parts) + (f" => {verdict}" if verdict else "")
