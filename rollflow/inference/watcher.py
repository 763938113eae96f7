"""``CheckpointWatcher``: watches ``checkpoints/LATEST`` and hot-loads each new version into its servers.

What it is: the piece beside the inference servers that turns a published checkpoint into served
weights. Each poll, in this order:

1. ``store.latest_version()`` (one small read); not newer than what the servers serve -> done; else
   ``store.resolve_latest()`` (LATEST + COMMIT.json);
2. ``store.ack(N, server_id, state="loading")`` for every server, so GC keeps N while it is loaded;
3. ``store.verified_dir(N, cache_dir)`` checks size + digest of every file against COMMIT.json **while
   the servers keep generating**: in place on a local root (nothing copied), downloaded into the cache
   (hashing on the way) on S3, or always into the cache with ``in_place=False``. On a local root, for an
   engine that ``verifies_on_load`` (rollflow's CPU server), the weight files' digests are left to the
   server, which hashes each file in the one read that loads it and refuses it if COMMIT.json's digest
   differs (``defer_weights``; the watcher sends COMMIT.json's files with the load): one read, not two;
4. per server (in parallel), through its ``Engine`` (``rollflow.inference.contract``): skip if it already
   reports version N; else ``engine.pause(mode)`` (``inference.update_pause_mode``; with "abort" in-flight
   requests return their partial output and the client resumes them, with "retract" the server keeps them
   and recomputes their KV cache under the new weights), ``engine.load_weights(<verified dir>, "N")``
   (SGLang: ``/update_weights_from_disk``; vLLM: ``/collective_rpc reload_weights``), and
   ``engine.resume()`` (always, also after a failed update);
5. ``store.ack(N, server_id)`` for each server now serving N (a failed one's "loading" ack is retracted),
   then ``on_update(N)`` once all do.

When it polls: a full poll every ``poll_interval_s`` (on S3 that bounds the request rate), and sooner
when (a) a trainer in this process moves LATEST (``store.subscribe()``: the embedded mode, where trainer
and watcher are threads of one process, sees a publish at once), or (b) on a local root, a stat of
LATEST every ``local_poll_interval_s`` shows that it was replaced (a sidecar or another process).

Server health (``rollflow.inference.fleet_health.FleetHealth``, which the watcher owns and which keeps
the acks): every ``health_interval_s`` (default ``poll_interval_s``) each server is asked which version
it serves (one GET). A server that does not answer is unreachable: it no longer
holds the others back (``serving_version`` and ``on_update`` follow the servers that answer), and it is
probed again on later polls. One that serves another version than the others (it was restarted and
serves the initial weights again) is loaded with the served version at once. When no server has
answered for ``dead_server_timeout_s``, ``on_fatal(message)`` is called once (the rollout loop then
stops with that message). ``drop_server`` removes a server for good (its supervisor gave up) and
retracts its ack; ``server_down`` retracts the ack of a server whose process died (its supervisor
restarts it); ``resync`` asks for a check and a catch-up load at once, skipping the retry backoff (its
supervisor restarted it and it is healthy). The served version is re-acked every ``ack_ttl_s / 4``,
so a live server's ack never expires and a dead one's does.

So generation stops only for the load itself (``pause_s``), never for the trainer's save or the verification.
Records ``publish_to_serving_s`` (COMMIT.json's ``created_at`` -> all servers serve N) and ``pause_s`` in
``events`` and the metrics sink. A corrupt or missing checkpoint, or a server refusing the weights, is
logged and recorded as an ``error`` event, and so is a malformed ``LATEST`` (the store then falls back
to the newest committed version); the old version keeps serving and the version is retried on
later polls with exponential backoff (``poll_interval_s * 2**k``, capped at ``max_backoff_s``), while a newer
version is tried at once.

Runs as a thread in the rollout process (``start()`` / ``stop()``) or as a sidecar next to SGLang or
vLLM (``python -m infra.watcher_sidecar``, whose defaults are the config's). Loading one server (pause,
load, resume) is ``rollflow.inference.weight_load.ServerLoader``.

What it is not: no generation, no GC of storage (the trainer's ``CheckpointStore.gc`` uses the acks),
no bookkeeping of which servers are live or what they serve (``FleetHealth``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rollflow.api.config import InferenceConfig
from rollflow.api.metrics import MetricsSink, NullSink
from rollflow.api.stores import CheckpointSource
from rollflow.clock.roles import RoleClock, Timeline
from rollflow.inference.contract import Engine
from rollflow.inference.fleet_health import FleetHealth, default_server_id
from rollflow.inference.sglang_protocol import PauseMode
from rollflow.inference.weight_load import ServerLoader, prune_cache

if TYPE_CHECKING:
    from storage.checkpoints import CheckpointRef

logger = logging.getLogger(__name__)

__all__ = ["CheckpointWatcher", "WatcherEvent", "default_server_id"]


@dataclass
class WatcherEvent:
    kind: Literal["update", "error"]
    version: int
    at: float  # wall clock (time.time())
    publish_to_serving_s: float | None = None
    fetch_s: float | None = None  # verifying (in place) or fetching + verifying (into the cache)
    pause_s: float | None = None  # longest pause over the servers
    servers: list[str] = field(default_factory=list)
    message: str = ""


@dataclass
class _CatchUp:
    """The reference ``_load`` gets for a version already served (no publish latency to record)."""

    version: int
    created_at: float | None = None


class CheckpointWatcher:
    """Keeps ``servers`` on the newest committed checkpoint of ``store``. Thread-safe reads of state."""

    def __init__(
        self,
        store: CheckpointSource,
        servers: Sequence[str],
        *,
        cache_dir: str | Path,
        poll_interval_s: float = 1.0,
        local_poll_interval_s: float = 0.02,
        in_place: bool = True,
        pause_mode: PauseMode = "abort",
        api_key: str | None = None,
        engine: Engine | None = None,
        server_ids: Sequence[str] | None = None,
        on_update: Callable[[int], None] | None = None,
        metrics: MetricsSink | None = None,
        request_timeout_s: float = 600.0,
        keep_cached: int = 2,
        max_backoff_s: float = 60.0,
        ack_ttl_s: float | None = None,
        health_interval_s: float | None = None,
        dead_server_timeout_s: float = 60.0,
        on_fatal: Callable[[str], None] | None = None,
        clock: RoleClock | None = None,
        update_log_level: int = logging.DEBUG,
    ) -> None:
        if not servers:
            raise ValueError("CheckpointWatcher needs at least one server address")
        self.store = store
        self.servers = list(servers)
        self.server_ids = list(server_ids) if server_ids else [default_server_id(a) for a in self.servers]
        if len(self.server_ids) != len(self.servers):
            raise ValueError(f"{len(self.server_ids)} server_ids for {len(self.servers)} servers")
        self.cache_dir = Path(cache_dir)
        self.poll_interval_s = poll_interval_s
        self.local_poll_interval_s = local_poll_interval_s
        self.in_place = in_place  # False: copy into cache_dir also on a local root (servers can't see it)
        self.pause_mode: PauseMode = pause_mode  # /pause_generation mode around each update
        self.api_key = api_key
        if engine is None:
            from rollflow.inference.sglang import SGLangEngine

            engine = SGLangEngine()
        self.engine: Engine = engine
        if pause_mode not in engine.pause_modes:
            raise ValueError(f"pause mode {pause_mode!r}: engine {engine.name} takes {engine.pause_modes}")
        self.on_update = on_update
        # one line per loaded version: chatter beside a training run (DEBUG), the news in a sidecar (INFO)
        self.update_log_level = update_log_level
        self.metrics: MetricsSink = metrics or NullSink()
        self.request_timeout_s = request_timeout_s
        self.keep_cached = max(1, keep_cached)
        self.max_backoff_s = max_backoff_s
        self.fleet = FleetHealth(
            store,
            self.servers,
            self.server_ids,
            api_key=api_key,
            engine=engine,
            health_interval_s=poll_interval_s if health_interval_s is None else health_interval_s,
            dead_server_timeout_s=dead_server_timeout_s,
            ack_ttl_s=ack_ttl_s,
            on_fatal=on_fatal,
        )
        # the ``weights`` role (rollflow.clock.roles): fetching, updating, loading, waiting
        self.clock = clock if clock is not None else Timeline().role("weights", initial="waiting")
        self.loader = ServerLoader(
            engine, self.clock, pause_mode=pause_mode, api_key=api_key, request_timeout_s=request_timeout_s
        )
        self.events: list[WatcherEvent] = []
        self._latest_problem: str | None = None  # last malformed-LATEST problem reported as an event
        self.serving_version: int | None = None  # the version every live, reachable server serves
        self._failures: dict[int, tuple[int, float]] = {}  # version -> (attempts, retry not before)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = store.subscribe()  # set by an in-process publish (and by stop())
        self._resynced = threading.Event()  # set by resync(): the next poll skips the retry backoff
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(
        cls,
        cfg: InferenceConfig,
        store: CheckpointSource,
        servers: Sequence[str],
        *,
        cache_dir: str | Path,
        on_update: Callable[[int], None] | None = None,
        metrics: MetricsSink | None = None,
        ack_ttl_s: float | None = None,
        on_fatal: Callable[[str], None] | None = None,
        clock: RoleClock | None = None,
        engine: Engine | None = None,
    ) -> CheckpointWatcher:
        """``poll_interval_s``, ``local_poll_interval_s``, ``update_pause_mode``, ``api_key``,
        ``weight_update_timeout_s`` and ``dead_server_timeout_s`` from the ``inference`` section;
        ``ack_ttl_s`` is ``storage.ack_ttl_s``; the engine is ``inference.backend``'s unless given."""
        from rollflow.inference.engines import engine_for

        return cls(
            store,
            servers,
            cache_dir=cache_dir,
            poll_interval_s=cfg.poll_interval_s,
            local_poll_interval_s=cfg.local_poll_interval_s,
            pause_mode=cfg.update_pause_mode,  # type: ignore[arg-type]
            api_key=cfg.api_key,
            engine=engine if engine is not None else engine_for(cfg),
            on_update=on_update,
            metrics=metrics,
            request_timeout_s=cfg.weight_update_timeout_s,
            ack_ttl_s=ack_ttl_s,
            dead_server_timeout_s=cfg.dead_server_timeout_s,
            on_fatal=on_fatal,
            clock=clock,
        )

    @property
    def errors(self) -> list[WatcherEvent]:
        with self._lock:
            return [e for e in self.events if e.kind == "error"]

    # --- one poll ------------------------------------------------------------------------------------------------

    def poll_once(self) -> int | None:
        """Run one poll (steps 1-5 above); returns the version now served if this poll changed it."""
        if not self.fleet.live():
            return None
        if self._resynced.is_set():  # a server came back: retry now, whatever the backoff said
            self._resynced.clear()
            self._failures.clear()
        self.fleet.check_if_due()
        try:
            hint = self.store.latest_version()
            if hint is not None and self.serving_version is not None and hint <= self.serving_version:
                self._catch_up()  # nothing new: bring restarted / returning servers to serving_version
                self.fleet.heartbeat()
                return None  # LATEST only names committed versions and never moves back: nothing new
            ref = self.store.resolve_latest()
        except Exception as e:
            logger.warning("cannot read LATEST: %s", e)
            return None
        self._note_latest_problem(self.store.latest_problem(), ref)
        if ref is None:
            return None
        v = int(ref.version)
        if self.serving_version is not None and v <= self.serving_version:
            self._catch_up()
            self.fleet.heartbeat()
            return None
        attempts, not_before = self._failures.get(v, (0, 0.0))
        if time.monotonic() < not_before:
            return None
        return self._load(v, ref, attempts)

    def _load(self, v: int, ref: CheckpointRef, attempts: int) -> int | None:
        """Load ``v`` into every live server that does not serve it; ``v`` if they all do afterwards."""
        targets = self.fleet.needing(v)
        t0 = time.perf_counter()
        commit: dict[str, Any] | None = None
        try:
            with self.clock.during("fetching"):
                self.fleet.ack_loading(v, targets)  # before reading any file: GC keeps what is being loaded
                if self.in_place and self.engine.verifies_on_load:
                    full = self.store.get(v)
                    if not full.is_adapter:  # the server hashes the weights as it reads them
                        commit = {"hash": full.hash_algo, "files": full.files}
                if self.in_place:
                    local = self.store.verified_dir(v, self.cache_dir, defer_weights=commit is not None)
                else:
                    local = self.store.fetch(v, self.cache_dir)
        except Exception as e:  # CheckpointIntegrityError / CheckpointNotFoundError / storage errors
            self.fleet.retract(v, targets)
            self._fail(v, attempts, f"fetch failed: {type(e).__name__}: {e}")
            return None
        fetch_s = time.perf_counter() - t0

        with self.clock.during("updating"):  # the round trips to the servers; ``loading`` while one is paused
            if len(targets) <= 1:
                results = [self.loader.update(a, local, v, commit) for a in targets]
            else:
                with ThreadPoolExecutor(max_workers=len(targets)) as pool:
                    results = list(pool.map(lambda a: self.loader.update(a, local, v, commit), targets))
        failed = []
        for addr, (status, _, msg) in zip(targets, results, strict=True):
            if status == "ok":
                self.fleet.on_serving(addr, v)
                continue
            self.fleet.retract(v, [addr])
            if status == "unreachable":  # dead or restarting: it must not hold the others back
                self.fleet.on_unreachable(addr, msg)
            else:
                failed.append(f"{addr}: {msg}")
        pause_s = max((p for st, p, _ in results if st == "ok"), default=0.0)
        if failed:
            self._fail(v, attempts, "; ".join(failed))
            return None
        reachable = self.fleet.reachable()
        if not reachable:
            self._fail(v, attempts, f"no inference server reachable: {self.fleet.unreachable_summary()}")
            return None
        if self.serving_version is not None and v <= self.serving_version:
            return None  # a catch-up load (a restarted server back on the served version)

        latency = time.time() - float(ref.created_at) if ref.created_at else None
        self._failures.pop(v, None)
        event = WatcherEvent("update", v, time.time(), latency, fetch_s, pause_s, reachable)
        with self._lock:
            self.serving_version = v
            self.events.append(event)
        metrics = {"watcher/version": float(v), "watcher/fetch_s": fetch_s, "watcher/pause_s": pause_s}
        if latency is not None:
            metrics["watcher/publish_to_serving_s"] = latency
        self.metrics.log(metrics, step=v)
        logger.log(
            self.update_log_level,
            "serving v%d on %d server(s): publish->serving %s, fetch %.3fs, pause %.3fs",
            v, len(reachable), f"{latency:.3f}s" if latency is not None else "n/a", fetch_s, pause_s,
        )  # fmt: skip
        prune_cache(self.cache_dir, self.keep_cached, serving=v)
        if self.on_update is not None:
            try:
                self.on_update(v)
            except Exception:
                logger.exception("on_update(%d) raised", v)
        return v

    # --- server health (kept by ``self.fleet``) -----------------------------------------------------------------

    def _catch_up(self) -> None:
        """Load ``serving_version`` into live servers known to serve something else (restarted ones)."""
        v = self.serving_version
        if v is None:
            return
        lagging = self.fleet.lagging(v)
        if not lagging:
            return
        attempts, not_before = self._failures.get(v, (0, 0.0))
        if time.monotonic() < not_before:
            return
        logger.warning("server(s) serve %s, not v%d (restarted?): loading v%d into them", lagging, v, v)
        self._load(v, _CatchUp(v), attempts)

    def drop_server(self, address: str, reason: str) -> None:
        """Stop updating ``address`` for good (its supervisor gave up on it) and retract its ack."""
        if self.fleet.drop(address, reason):
            self._wake.set()

    def server_down(self, address: str, reason: str) -> None:
        """``address``'s process died (its supervisor restarts it): its ack goes at once (``FleetHealth.retire``)."""
        self.fleet.retire(address, reason)

    def resync(self, address: str) -> None:
        """``address`` was restarted and is healthy: check what it serves and catch it up at once, without
        the retry backoff (the failures it counts were the server being down, not the checkpoint)."""
        self.fleet.resync(address)
        self._resynced.set()
        self._wake.set()

    def _note_latest_problem(self, problem: str | None, ref: Any | None) -> None:
        """A malformed LATEST is an error event (once per distinct problem); the store already fell
        back to the newest committed version, so updates go on.
        """
        if problem is None or problem == self._latest_problem:
            self._latest_problem = problem
            return
        self._latest_problem = problem
        v = int(ref.version) if ref is not None else -1
        with self._lock:
            self.events.append(
                WatcherEvent("error", v, time.time(), servers=list(self.servers), message=problem)
            )
            n_errors = sum(1 for e in self.events if e.kind == "error")
        self.metrics.log({"watcher/errors": float(n_errors)}, step=max(v, 0))

    def _fail(self, v: int, attempts: int, message: str) -> None:
        delay = min(self.poll_interval_s * 2**attempts, self.max_backoff_s)
        self._failures[v] = (attempts + 1, time.monotonic() + delay)
        logger.error(
            "checkpoint v%d not served (attempt %d, retry in %.1fs): %s", v, attempts + 1, delay, message
        )
        with self._lock:
            self.events.append(
                WatcherEvent("error", v, time.time(), servers=list(self.servers), message=message)
            )
            n_errors = sum(1 for e in self.events if e.kind == "error")
        self.metrics.log({"watcher/errors": float(n_errors)}, step=v)

    # --- thread ----------------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Poll until ``stop`` (or ``self.stop()``) is set; first poll at once (see "When it polls")."""
        stop = stop or self._stop
        while not stop.is_set() and not self._stop.is_set():
            self._wake.clear()  # before reading LATEST: a publish from now on wakes the next wait
            token = self._latest_token()
            try:
                self.poll_once()
            except Exception:
                logger.exception("watcher poll failed")
            self._wait(stop, token)

    def _latest_token(self) -> Any | None:
        if self.local_poll_interval_s <= 0:
            return None
        try:
            return self.store.latest_token()
        except Exception:
            return None

    def _wait(self, stop: threading.Event, token: Any | None) -> None:
        """Until the next full poll, or sooner: an in-process publish, or LATEST's stat changing."""
        deadline = time.monotonic() + self.poll_interval_s
        step = self.local_poll_interval_s if token is not None else self.poll_interval_s
        while not stop.is_set() and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wake.wait(min(step, left)):
                return
            if token is not None and self._latest_token() != token:
                return

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="checkpoint-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop polling; a server that stops answering from now on is expected (no ERROR lines)."""
        self.fleet.quiet = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_for_version(self, version: int, timeout_s: float) -> bool:
        """Block until all servers serve ``version`` (or newer); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sv = self.serving_version
            if sv is not None and sv >= version:
                return True
            time.sleep(0.02)
        return False
