"""How busy the machine's cores and this run's processes are, read from ``/proc`` (Linux).

What it is:
- ``CoreMeter``: each core's busy share between two readings of ``/proc/stat``, for the cores this process
  may run on (``sched_getaffinity``). A core's busy jiffies are its total minus ``idle`` and ``iowait``:

      busy_frac(core, [a, b]) = (busy_b - busy_a) / (total_b - total_a)

- ``ProcessMeter``: CPU seconds (user + system) of named processes between readings of
  ``/proc/<pid>/stat``, as a share of one core: ``cores_used = d(cpu_s) / d(wall_s)`` (2.0 = two full cores).

Where ``/proc`` is missing (not Linux) both report nothing (``available`` is False).
What it is not: a sampler thread (``rollflow.timing.report`` drives them) nor per-thread accounting.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_core_jiffies(path: Path = PROC_STAT) -> dict[int, tuple[int, int]]:
    """``{core: (busy, total)}`` jiffies from a ``/proc/stat`` file ({} if unreadable)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            core, values = int(name[3:]), [int(f) for f in fields]
        except ValueError:
            continue
        total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        out[core] = (total - idle, total)
    return out


class CoreMeter:
    """Busy share of each usable core since the previous ``sample()`` and since the meter was made."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self.path = path
        try:
            self.cores = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self.cores = list(range(os.cpu_count() or 1))
        self._first = self._read()
        self._last = self._first
        self.available = bool(self._first)

    def _read(self) -> dict[int, tuple[int, int]]:
        got = read_core_jiffies(self.path)
        return {c: got[c] for c in self.cores if c in got}

    @staticmethod
    def _fracs(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> dict[int, float]:
        out = {}
        for core, (busy, total) in b.items():
            if core in a and total > a[core][1]:
                out[core] = max(0.0, min(1.0, (busy - a[core][0]) / (total - a[core][1])))
        return out

    def sample(self) -> dict[int, float]:
        """Each core's busy share since the previous call."""
        now = self._read()
        out = self._fracs(self._last, now)
        self._last = now
        return out

    def since_start(self) -> dict[int, float]:
        """Each core's busy share since the meter was made."""
        return self._fracs(self._first, self._read())


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (None if it is gone or ``/proc`` is missing)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()  # the command name may hold spaces; fields start after ')'
    try:
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat(5))
    except (IndexError, ValueError):
        return None


class ProcessMeter:
    """Cores used by each named process between calls of ``sample()`` (see the module docstring)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self._last = {name: (time.monotonic(), process_cpu_s(pid)) for name, pid in self.pids.items()}

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            now, cpu = time.monotonic(), process_cpu_s(pid)
            t0, cpu0 = self._last.get(name, (now, None))
            self._last[name] = (now, cpu)
            if cpu is not None and cpu0 is not None and now > t0:
                out[name] = (cpu - cpu0) / (now - t0)
        return out
