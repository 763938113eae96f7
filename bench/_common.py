"""Small helpers shared by the benchmark scripts: interleaved timing, a loopback moto S3 server, output.

Not a benchmark itself, and not imported by library code.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def interleaved(
    fns: dict[str, Callable[[int], Any]],
    reps: int,
    *,
    setup: Callable[[str, int], Any] | None = None,
    teardown: Callable[[str, int], Any] | None = None,
) -> dict[str, list[float]]:
    """Time each fn `reps` times, alternating between them (rep i: a, b, ...; rep i+1: b, a, ...).

    Alternating spreads machine noise (other processes, page-cache state) evenly over the variants.
    `setup` / `teardown` run untimed around each call.
    """
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(reps):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            if setup:
                setup(n, i)
            t0 = time.perf_counter()
            fns[n](i)
            times[n].append(time.perf_counter() - t0)
            if teardown:
                teardown(n, i)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ratio(times: dict[str, list[float]], ours: str, raw: str) -> float:
    """median(ours) / median(raw)."""
    return median(times[ours]) / median(times[raw])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[dict[str, str]]:
    """A moto S3 server in a subprocess on 127.0.0.1; yields Storage options. Stopped by PID after."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError("moto server exited early")
            try:
                urllib.request.urlopen(endpoint + "/", timeout=0.5).read()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield {"endpoint_url": endpoint, "key": "testing", "secret": "testing", "region": "us-east-1"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def report(name: str, figures: dict[str, float], details: dict[str, Any]) -> Path:
    """Print `name value` per figure; write the same to bench/results/{name}.json.

    `details` (raw timings, sizes, machine) go to bench/results/{name}_details.json.
    """
    for k, v in figures.items():
        print(f"{k} {v:.3f}", flush=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{name}.json"
    out.write_text(json.dumps({k: round(v, 4) for k, v in figures.items()}, indent=1) + "\n")
    (RESULTS_DIR / f"{name}_details.json").write_text(json.dumps(details, indent=1, sort_keys=True) + "\n")
    return out


def unwarmed_tiny_model(out: Path) -> Path:
    """The embedded default's tiny Llama at ``out``, without the warm start (for benches where the weights
    do not matter, only the shapes and the server path)."""
    from rollflow.api.config import TinyModelConfig
    from rollflow.models import bootstrap_tiny_model

    return bootstrap_tiny_model(TinyModelConfig(warm_start_steps=0), out, seed=0)


def hash_throughput(algo: str, *, parallel: bool = False, mib: int = 64, reps: int = 4) -> float:
    """MB/s of one hasher over `mib` MiB in memory: one core, or (`parallel`, blake3) all cores.
    The best of `reps` passes (the machine is shared: the best pass is the least disturbed)."""
    from storage.transfer import new_hasher

    data = os.urandom(mib * 2**20)
    new_hasher(algo, parallel=parallel).update(data)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        new_hasher(algo, parallel=parallel).update(data)
        best = min(best, time.perf_counter() - t0)
    return mib * 2**20 / 1e6 / best
