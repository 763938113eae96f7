"""Loading one verified checkpoint into one server: pause, load, resume, through the server's engine.

What it is: ``ServerLoader.update(address, local_dir, version)`` runs step 4 of the watcher's poll for one
server (``rollflow.inference.watcher``): skip it if it already reports ``version``; else
``engine.pause(mode)``, ``engine.load_weights(local_dir, "N")`` and ``engine.resume()`` (always, also after
a failed load). While any server is paused the ``weights`` role of the timeline is ``loading`` (generation
stops there), else ``updating``. The answer is ``(status, pause_s, error)`` with status ``"ok"``,
``"unreachable"`` (it did not answer: dead or restarting) or ``"failed"`` (it refused the weights).
``prune_cache`` keeps the local cache of verified versions to the newest few.
What it is not: choosing the version, verifying its files or keeping acks (the watcher and its
``FleetHealth`` do), or the engine's wire protocol (``rollflow.inference.contract.Engine``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Literal

from rollflow.api.errors import InferenceError, ServerUnavailableError
from rollflow.clock.roles import RoleClock
from rollflow.inference.contract import Engine
from rollflow.inference.sglang_protocol import PauseMode

LoadStatus = Literal["ok", "unreachable", "failed"]
_VERSION_DIR = re.compile(r"^v(\d{6,})$")


def prune_cache(cache_dir: Path, keep_cached: int, *, serving: int) -> None:
    """Delete cached version dirs (``v{N:06d}``, what loads read from S3) beyond the newest
    ``keep_cached``, never the one being served."""
    if not cache_dir.is_dir():
        return
    versions = sorted(
        (int(m.group(1)), p) for p in cache_dir.iterdir() if p.is_dir() and (m := _VERSION_DIR.match(p.name))
    )
    for ver, path in versions[:-keep_cached]:
        if ver != serving:
            shutil.rmtree(path, ignore_errors=True)


class ServerLoader:
    """Pause -> load -> resume for the servers of one watcher; thread-safe (servers load in parallel)."""

    def __init__(
        self,
        engine: Engine,
        clock: RoleClock,
        *,
        pause_mode: PauseMode,
        api_key: str | None,
        request_timeout_s: float,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.pause_mode: PauseMode = pause_mode  # /pause_generation mode around each update
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self._pause_lock = threading.Lock()
        self._n_paused = 0  # servers paused for a load right now

    def _paused(self, delta: int) -> None:
        """Count servers paused for a load; the ``weights`` role is ``loading`` while any is (generation stops
        there, and the rollout shows ``paused``), else back to ``updating``."""
        with self._pause_lock:
            self._n_paused += delta
            self.clock.enter("loading" if self._n_paused > 0 else "updating")

    def update(
        self, addr: str, local: Path, v: int, commit: dict[str, Any] | None = None
    ) -> tuple[LoadStatus, float, str]:
        """Pause -> load -> resume one server through its engine; ``(status, pause_s, error)``. ``commit``:
        COMMIT.json's ``{"hash", "files"}`` for an engine that checks the weights as it reads them."""
        kw: dict[str, Any] = {"api_key": self.api_key, "timeout_s": 30.0}
        eng = self.engine
        try:
            if eng.served_version(addr, **kw) == str(v):
                return "ok", 0.0, ""
            t0 = time.perf_counter()
            eng.pause(addr, self.pause_mode, **kw)
            self._paused(+1)
            try:
                eng.load_weights(
                    addr, local, str(v), api_key=self.api_key, timeout_s=self.request_timeout_s, commit=commit
                )
            finally:
                try:
                    with contextlib.suppress(ServerUnavailableError):  # it died: the pause died with it
                        eng.resume(addr, **kw)
                finally:
                    self._paused(-1)
            return "ok", time.perf_counter() - t0, ""
        except ServerUnavailableError as e:
            return "unreachable", 0.0, str(e)
        except InferenceError as e:
            return "failed", 0.0, str(e)
