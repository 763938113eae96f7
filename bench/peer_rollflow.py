"""rollflow's side of the peer benchmark: one run of the real loops on a training-seconds budget.

What it is: ``python -m bench.peer_rollflow SPEC.json``, started by ``bench.peer`` in a fresh process. It
runs what the embedded ``async-rl`` flow runs - CPU inference server(s), the checkpoint watcher, the
rollout loop (executor + shard writer) and the trainer, meeting only through storage - without Prefect
or MLflow, so that nothing but rollflow's own machinery is on the clock:

* the clock starts when the trainer has built its model and optimizer (servers already healthy, the
  rollout loop started with the trainer: TRL's clock likewise starts after its model is loaded) and
  stops at the first step end past ``seconds``; the time spent copying snapshots is taken off it;
* a snapshot of the trainer's weights is kept whenever the clock crosses a multiple of
  ``snapshot_every_s`` (after the step that crossed it), after each optimizer step listed in
  ``snapshot_steps`` (the per-step comparison with TRL) and at the end, then evaluated offline by
  ``bench.peer`` with the same code as TRL's snapshots (the model it starts from is the 0 s point);
* ``sync: true`` runs the synchronous baseline (``rollout.max_staleness=0`` and
  ``rollout.pause_during_training``: the trainer pauses the servers around each step).

Spec keys: ``config``, ``overrides`` (dotted), ``seed``, ``seconds``, ``max_steps`` (optional), ``snapshot_every_s``,
``snapshot_steps`` (optional), ``out_dir``, ``sync``. Output: ``out_dir/curve.json`` (+ ``snap-NNN.safetensors``), the same format as
``bench/peer_trl.py``, plus rollflow's per-step timings and rollout counters.

What it is not: a product entry point (use ``flows/async_rl.py``) or an evaluator (``bench.peer_eval``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rollflow.api.config import ExperimentConfig
from rollflow.api.metrics import InMemorySink
from rollflow.configuration.loader import load_config
from rollflow.trial.store import open_trial_storage

logger = logging.getLogger("bench.peer_rollflow")


class _Prefixed:
    """A sink that files every metric under ``prefix`` in one shared in-memory sink."""

    def __init__(self, sink: InMemorySink, prefix: str) -> None:
        self.sink, self.prefix = sink, prefix

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.sink.log({self.prefix + k: v for k, v in metrics.items()}, step=step)


class Clock:
    """Training seconds: wall time since ``start`` minus the time spent on snapshots."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.excluded = 0.0
        self._lock = threading.Lock()

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        with self._lock:
            return time.perf_counter() - self.t0 - self.excluded

    def exclude(self, seconds: float) -> None:
        with self._lock:
            self.excluded += seconds


class SnapshotHooks:
    """TrainerHooks: keep a copy of the weights at each ``every_s`` mark and after each step in ``steps``;
    pause servers in sync mode."""

    def __init__(
        self,
        clock: Clock,
        every_s: float,
        budget_s: float,
        stop: threading.Event,
        steps: tuple[int, ...] = (),
        max_steps: int = 10**9,
    ) -> None:
        self.clock, self.every_s, self.budget_s, self.stop = clock, every_s, budget_s, stop
        self.max_steps = max_steps  # a step budget beside the seconds (bench.peer --max-steps)
        self.steps = frozenset(steps)  # versions (= optimizer steps done) that get a snapshot
        self.trainer: Any = None
        self.control: Any = None  # infra.control.ServerControl in the synchronous baseline
        self.snapshots: list[dict[str, Any]] = []
        self._next_mark = every_s
        self.step_ends: list[float] = []

    def take(self, version: int) -> None:
        t_begin = time.perf_counter()
        t = self.clock.now()
        sd = _policy_weights(self.trainer.model)
        self.snapshots.append({"t": t, "step": version, "weights": sd})
        while self._next_mark <= t:
            self._next_mark += self.every_s
        self.clock.exclude(time.perf_counter() - t_begin)

    def before_step(self, version: int) -> None:
        if self.control is not None:
            self.control.pause()

    def after_step(self, version: int) -> None:
        if self.control is not None:
            self.control.resume()
        now = self.clock.now()
        self.step_ends.append(now)
        last = now >= self.budget_s or version >= self.max_steps
        if now >= self._next_mark or last or version in self.steps:
            self.take(version)
        if last:
            self.stop.set()


def _config(spec: dict[str, Any]) -> ExperimentConfig:
    out = Path(spec["out_dir"])
    overrides = [
        *spec.get("overrides", []),
        f"seed={int(spec['seed'])}",
        f"trial=peer-s{int(spec['seed'])}{'-sync' if spec.get('sync') else ''}",
        f"storage.root={out / 'storage'}",
        f"storage.local_cache={out / 'cache'}",
        "train.steps=1000000",
        "train.resume_every=1000000",
        "tracking.enabled=false",
    ]
    if spec.get("sync"):
        overrides += ["rollout.max_staleness=0", "rollout.pause_during_training=true"]
    return load_config(spec["config"], overrides)


def _rollout(
    cfg: ExperimentConfig, storage: Any, client: Any, stop: threading.Event, sink: Any, timeline: Any = None
) -> Any:
    from rollflow.rollout.loop import run_rollout_loop

    async def go() -> Any:
        try:
            return await run_rollout_loop(
                cfg, storage, client, version_fn=client.get_version, stop_event=stop,
                metrics=sink, writer_name="peer", metrics_interval_s=1.0, timeline=timeline,
            )  # fmt: skip
        finally:
            await client.aclose()

    return asyncio.run(go())


def rollout_only(spec: dict[str, Any]) -> None:
    """The rollout loop and the checkpoint watcher, in this process, until SIGTERM (``rollout_process``)."""
    from transformers import AutoTokenizer  # noqa: F401  (see run())

    from rollflow.inference.client import EngineClient
    from rollflow.inference.watcher import CheckpointWatcher
    from storage.checkpoints import CheckpointStore

    cfg = _config(spec)
    out = Path(spec["out_dir"])
    addresses = json.loads((out / "servers.json").read_text())
    storage = open_trial_storage(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sink = InMemorySink()
    client = EngineClient.from_config(cfg.inference, addresses, metrics=sink)
    watcher = CheckpointWatcher.from_config(
        cfg.inference, CheckpointStore(storage), addresses, cache_dir=Path(cfg.storage.local_cache),
        on_update=client.set_version, metrics=sink,
    )  # fmt: skip
    watcher.start()
    try:
        _rollout(cfg, storage, client, stop, sink)
    finally:
        watcher.stop()
    keys = ("completions_generated", "busy_s", "rejected_filtered", "groups_accepted")
    (out / "rollout.json").write_text(json.dumps({f"rollout/{k}": sink.last(k) or 0.0 for k in keys}))


def run(spec: dict[str, Any]) -> dict[str, Any]:
    # transformers' lazy module is not safe to import from two threads at once: import it here first
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from infra.control import ServerControl
    from infra.servers import launch_local_servers
    from rollflow.clock.roles import Timeline
    from rollflow.inference.client import EngineClient
    from rollflow.inference.watcher import CheckpointWatcher
    from rollflow.timing.report import TimingReporter, bounds
    from rollflow.training.warm_start_reuse import trainer_class
    from storage.checkpoints import CheckpointStore

    cfg = _config(spec)
    Trainer = trainer_class(cfg)  # noqa: N806  # the plain Trainer unless train.warm_start_from is set (bench.reuse)
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    seconds, every = float(spec["seconds"]), float(spec["snapshot_every_s"])
    storage = open_trial_storage(cfg)
    sink = InMemorySink()
    stop = threading.Event()
    clock = Clock()
    hooks = SnapshotHooks(
        clock, every, seconds, stop, tuple(spec.get("snapshot_steps", ())), int(spec.get("max_steps", 10**9))
    )
    servers = launch_local_servers(cfg.inference, cfg.model.path, log_dir=out / "server-logs")
    timeline = Timeline()  # where the time goes (rollflow.timing): the same accounting as the flow's
    reporters: list[TimingReporter] = []
    try:
        if spec.get("sync"):
            hooks.control = ServerControl(servers.addresses, api_key=cfg.inference.api_key)
        trainer = Trainer(
            cfg, storage, metrics=_Prefixed(sink, "train/"), stop_event=stop, hooks=hooks, timeline=timeline
        )
        hooks.trainer = trainer
        rollout_sink = _Prefixed(sink, "rollout/")
        client = EngineClient.from_config(cfg.inference, servers.addresses, metrics=rollout_sink)
        watcher = CheckpointWatcher.from_config(
            cfg.inference,
            CheckpointStore(storage),
            servers.addresses,
            cache_dir=Path(cfg.storage.local_cache),
            on_update=client.set_version,
            metrics=rollout_sink,
            clock=timeline.role("weights", initial="waiting"),
        )
        results: dict[str, Any] = {}

        def train() -> None:
            try:
                results["train"] = trainer.run()
            except BaseException as e:  # surfaced below
                results["train_error"] = e
            finally:
                stop.set()

        def rollout() -> None:
            try:
                results["rollout"] = _rollout(cfg, storage, client, stop, rollout_sink, timeline)
            except BaseException as e:
                results["rollout_error"] = e
            finally:
                stop.set()

        # TRL's clock starts once its model and optimizer are built; ours once the trainer's are
        # (the rollout side starts with the trainer and any setup it takes longer is on the clock)
        setup = trainer._setup

        def setup_then_start_clock() -> None:
            setup()
            clock.start()
            pids = {"flow": os.getpid(), **servers.pids()}
            reporters.append(TimingReporter(timeline, addresses=servers.addresses, pids=pids).start())

        trainer._setup = setup_then_start_clock  # type: ignore[method-assign]
        child = None
        if spec.get("rollout_process"):  # the rollout loop + watcher in a process of their own
            (out / "servers.json").write_text(json.dumps(servers.addresses))
            child = subprocess.Popen(
                [sys.executable, "-m", "bench.peer_rollflow", "--rollout", spec["spec_path"]]
            )
            loops = [train]
        else:
            watcher.start()
            loops = [train, rollout]
        threads = [threading.Thread(target=f, name=f.__name__) for f in loops]
        for t in threads:
            t.start()
        # (the 0 s point is the model the run starts from: bench.peer scores it once for both systems)
        while not stop.wait(1.0):  # the trainer's after_step sets it at the budget
            if child is not None and child.poll() is not None:
                results["rollout_error"] = RuntimeError(f"rollout process exited {child.returncode}")
                break
        stop.set()
        if child is not None:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=120)
            for k, v in json.loads((out / "rollout.json").read_text()).items():
                sink.log({k: v})
        for t in threads:
            t.join(timeout=300)
        watcher.stop()
    finally:
        timing = reporters[0].stop() if reporters else {}  # before the servers go: their last counters
        servers.stop()
    for key in ("train_error", "rollout_error"):
        if key in results:
            raise RuntimeError(f"rollflow {key.split('_')[0]} loop failed: {results[key]!r}") from results[
                key
            ]
    train_summary = results["train"]
    train_s = hooks.step_ends[-1] if hooks.step_ends else clock.now()
    completions = sink.last("rollout/completions_generated") or 0.0
    snaps = []
    for i, s in enumerate(hooks.snapshots):
        name = f"snap-{i:03d}.safetensors"
        save_file(s["weights"], str(out / name))
        snaps.append({"t": s["t"], "step": s["step"], "file": name})
    curve = {
        "system": "rollflow-sync" if spec.get("sync") else "rollflow",
        "seed": int(spec["seed"]),
        "steps": int(train_summary.steps_run),
        "train_seconds": train_s,
        "completions": completions,
        "completions_per_s": completions / max(train_s, 1e-9),
        "step_seconds": sink.values("train/step_time_s"),
        "data_wait_s": sink.values("train/data_wait_s"),
        "compute_s": sink.values("train/compute_time_s"),
        "checkpoint_s": sink.values("train/checkpoint_time_s"),
        "step_end_t": hooks.step_ends,
        "reward_mean": sink.values("train/reward_mean"),
        "signal_group_frac": sink.values("train/signal_group_frac"),
        "staleness_mean": sink.values("train/staleness_mean"),
        "dropped_stale": train_summary.dropped_stale,
        "rollout_busy_s": sink.last("rollout/busy_s"),
        "rollout_rejected_filtered": sink.last("rollout/rejected_filtered") or 0.0,
        "rollout_accepted": sink.last("rollout/groups_accepted") or 0.0,
        "rollout_review": {k: sink.last(k) for k in sorted(sink.history) if "review/" in k},
        "snapshots": snaps,
        "timing": timing,  # time/... figures over the race (rollflow.timing.report)
        "time_bounds": bounds(timing) if timing else None,
    }
    (out / "timeline.json").write_text(json.dumps(timeline.document()))
    (out / "curve.json").write_text(json.dumps(curve))
    return curve


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rollout_mode = bool(args) and args[0] == "--rollout"
    args = args[1:] if rollout_mode else args
    if len(args) != 1:
        print("usage: python -m bench.peer_rollflow [--rollout] SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    spec = json.loads(Path(args[0]).read_text())
    spec["spec_path"] = str(Path(args[0]).resolve())
    torch.set_num_threads(int(spec.get("threads", 1)))
    if rollout_mode:
        rollout_only(spec)
        return 0
    curve = run(spec)
    name = curve["system"].replace("-", "_")
    print(f"{name}_steps {curve['steps']}")
    print(f"{name}_train_seconds {curve['train_seconds']:.1f}")
    print(f"{name}_completions_per_s {curve['completions_per_s']:.1f}")
    print(f"{name}_s_per_step {curve['train_seconds'] / max(1, curve['steps']):.3f}")
    return 0


def _policy_weights(model: Any) -> dict[str, Any]:
    """The policy's weights under the base model's names: a LoRA policy (``train.lora``) is snapshotted
    merged (W + (alpha / r) B A, peft's ``merge_and_unload`` on a copy), so the scorer loads either kind."""
    import copy

    from rollflow.training.distributed import unwrap

    inner = unwrap(model)
    if hasattr(inner, "peft_config"):
        inner = copy.deepcopy(inner).merge_and_unload()
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in inner.state_dict().items()}


if __name__ == "__main__":
    sys.exit(main())
