"""Scale-out benchmark: committed groups/s with 1, 2 and 4 rollout worker processes on one trial.

Run:  .venv/bin/python -m bench.scale              (about 2 minutes: 3 runs of --seconds 25 + start-up)
      .venv/bin/python -m bench.scale --seconds 8   (smoke run)
      .venv/bin/python -m bench.scale --s3          (the same on a loopback moto S3 server)

Prints one `name value` line per figure and writes them to bench/results/scale.json (raw numbers in
scale_details.json):

- groups_per_s_1, groups_per_s_2, groups_per_s_4: trajectory groups committed per second by 1, 2, 4
  rollout worker processes (each a real `run_rollout_loop`: prompt claims, staleness bound, ledger syncs,
  heartbeats, Parquet shards with commit records), measured over `--seconds` after every worker has
  committed once;
- scale_2_over_1, scale_4_over_1: the ratios;
- list_requests_per_step: LIST requests per trainer step (the trainer's `ShardReader.take` polls,
  counted by its `PartitionLister`) in the 4-worker run; `list_requests_per_step_first_half` /
  `_second_half` and `polls_per_step` in the details show whether it stays flat as the run grows
  (each poll costs 1 + hot partitions LISTs; a trainer that waits for data polls more often).

What is simulated, and why. The inference servers are not on this machine in the layout this models
(they are GPU pods); a worker's client waits `--gen-ms` per request and returns `--tokens` tokens, so
the figures measure the rollout workers' own work and the coordination between them, not generation.
The trainer is a thread of this process that takes `batch_size` groups per step with the trainer's own
reader and collector (oldest first, staleness floor, object-store polling) and publishes the next
version at once, so it is not the bound. The staleness bound
is loose here (max_staleness 4), so what limits throughput is CPU: on a 2-core machine 4 worker
processes plus the trainer share 2 cores, and the curve flattens where the cores are saturated.
This is a script, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench._common import moto_server, report
from rollflow.api.inference import GenerateRequest, GenerateResult
from rollflow.api.workflow import RolloutWorkflow
from storage.fs import Storage
from storage.schema import TrajectoryGroup, TrajectoryRow

VERSION_KEY = "bench/version.json"


class SimulatedServers:
    """An inference client: each request waits ``gen_s`` and returns ``tokens`` tokens at the version the
    bench trainer last published (read from storage every 0.2 s, like a checkpoint watcher)."""

    def __init__(self, storage: Storage, gen_s: float, tokens: int) -> None:
        self.storage, self.gen_s, self.tokens = storage, gen_s, tokens
        self.version = 0
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                self.version = int(self.storage.get_json(VERSION_KEY)["version"])

    async def agenerate(self, req: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(self.gen_s)
        v = self.version
        out = [random.randrange(1000) for _ in range(self.tokens)]
        return GenerateResult(
            req.rid or "r", req.input_ids, out, [-0.5] * self.tokens, [v] * self.tokens, "stop"
        )

    def get_version(self) -> int:
        return self.version


class BenchWorkflow(RolloutWorkflow):
    """``group_size`` concurrent requests per prompt, one row each (the row building is real work)."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    async def arun_episode(self, client: Any, data: dict[str, Any]) -> TrajectoryGroup | None:
        prompt = [1 + (hash(data["prompt_id"]) + i) % 997 for i in range(32)]
        results = await asyncio.gather(
            *(client.agenerate(GenerateRequest(prompt)) for _ in range(self.group_size))
        )
        gid = uuid.uuid4().hex
        rows = [
            TrajectoryRow.build(
                traj_id=f"{gid}-{i}",
                group_id=gid,
                prompt_id=str(data["prompt_id"]),
                input_ids=prompt + r.output_ids,
                loss_mask=[0] * len(prompt) + [1] * len(r.output_ids),
                logprobs=[0.0] * len(prompt) + r.output_logprobs,
                versions=[-1] * len(prompt) + r.output_versions,
                reward=float(random.random() < 0.5),
                finish_reason="stop",
            )  # fmt: skip
            for i, r in enumerate(results)
        ]
        return TrajectoryGroup(gid, rows[0].prompt_id, rows)


def bench_config(args: argparse.Namespace) -> Any:
    from rollflow.api.config import ExperimentConfig

    cfg = ExperimentConfig()
    cfg.train.batch_size = args.batch
    cfg.rollout.max_staleness = 4
    cfg.rollout.max_concurrent_rollouts = args.concurrency
    cfg.rollout.group_size = args.group_size
    cfg.rollout.shard_flush_rows = 16 * args.group_size
    cfg.rollout.shard_flush_seconds = 0.5
    cfg.rollout.claim_block_size = 4
    return cfg


def worker_main(args: argparse.Namespace) -> None:
    """One rollout worker process (started by the parent with --worker)."""
    from rollflow.rollout.loop import run_rollout_loop

    storage = Storage.open(args.root, "bench", args.trial, json.loads(args.options))
    client = SimulatedServers(storage, args.gen_ms / 1000, args.tokens)
    rows = [
        {"prompt_id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}], "answer": "1"}
        for i in range(5000)
    ]
    summary = asyncio.run(
        run_rollout_loop(
            bench_config(args), storage, client, prompts=rows, workflow=BenchWorkflow(args.group_size),
            writer_name=args.name, done_poll_s=0.5, metrics_interval_s=3600,
        )
    )  # fmt: skip
    print(json.dumps({"name": args.name, "accepted": summary.accepted, "stopped_by": summary.stopped_by}))


class Trainer(threading.Thread):
    """Takes batch_size groups per step through the trainer's own reader and collector (polling as the
    trainer does on an object store: 0.2 s, backing off to 2 s while nothing arrives), then publishes the
    next version at once."""

    def __init__(self, storage: Storage, batch: int, max_staleness: int) -> None:
        super().__init__(daemon=True)
        from rollflow.training.source import BatchCollector
        from storage.shard_reader import ShardReader

        self.storage, self.batch, self.eta = storage, batch, max_staleness
        self.reader = ShardReader(storage)
        self.stop = threading.Event()
        self.collector = BatchCollector(
            self.reader, timeout_s=600, poll_interval_s=0.2, max_poll_interval_s=2.0, stop_event=self.stop
        )
        self.version = 0
        self.steps: list[tuple[float, int, int]] = []  # (time, list calls, polls) after each step
        self.dropped = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                floor = self.version - self.eta
                got = self.collector.collect(self.batch, min_head_version=floor if floor > 0 else None)
                if got is None:
                    break
                self.dropped += got.dropped_stale
                self.version += 1
                self.storage.put_json(VERSION_KEY, {"version": self.version})
                lister = self.reader.lister
                self.steps.append((time.monotonic(), lister.list_calls, lister.polls))
        except BaseException as e:
            self.error = e


def run_workers(n: int, args: argparse.Namespace, root: str, options: dict[str, Any]) -> dict[str, Any]:
    from storage.checkpoints import CheckpointStore
    from storage.group_ledger import GroupLedger

    trial = f"w{n}-{uuid.uuid4().hex[:6]}"
    storage = Storage.open(root, "bench", trial, options)
    trainer = Trainer(storage, args.batch, 4)
    trainer.start()
    cmd = [sys.executable, "-m", "bench.scale", "--worker", "--root", root, "--trial", trial,
           "--options", json.dumps(options), "--gen-ms", str(args.gen_ms), "--tokens", str(args.tokens),
           "--group-size", str(args.group_size), "--batch", str(args.batch),
           "--concurrency", str(args.concurrency)]  # fmt: skip
    procs = [subprocess.Popen([*cmd, "--name", f"worker{i}"], stdout=subprocess.PIPE) for i in range(n)]
    ledger = GroupLedger(storage)
    try:
        deadline = time.monotonic() + 120
        while len(ledger.refresh().by_writer) < n:  # every worker has committed at least once
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"workers did not all start committing ({ledger.refresh().by_writer})")
            time.sleep(0.2)
        t0, g0 = time.monotonic(), ledger.refresh().accepted
        time.sleep(args.seconds)
        t1, g1 = time.monotonic(), ledger.refresh().accepted
        per_writer = ledger.refresh().by_writer
    finally:
        CheckpointStore(storage).mark_done({"version": trainer.version})
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        trainer.stop.set()
        trainer.join(30)
    if trainer.error is not None:
        raise trainer.error
    steps = [s for s in trainer.steps if t0 <= s[0] <= t1]
    half = len(steps) // 2

    def per_step(xs: list[tuple[float, int, int]], i: int = 1) -> float:
        return (xs[-1][i] - xs[0][i]) / max(1, len(xs) - 1) if len(xs) >= 2 else float("nan")

    return {
        "workers": n,
        "groups_per_s": (g1 - g0) / (t1 - t0),
        "window_s": round(t1 - t0, 2),
        "groups_in_window": g1 - g0,
        "per_writer_total": per_writer,
        "trainer_steps_in_window": len(steps),
        "trainer_version": trainer.version,
        "trainer_dropped_stale": trainer.dropped,
        "list_requests_per_step": per_step(steps),
        "list_requests_per_step_first_half": per_step(steps[: half + 1]),
        "list_requests_per_step_second_half": per_step(steps[half:]),
        "polls_per_step": per_step(steps, 2),
        "worker_outputs": [o.strip().splitlines()[-1] if o.strip() else "" for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=25.0, help="measured window per worker count")
    ap.add_argument("--s3", action="store_true", help="use a loopback moto S3 server instead of a local dir")
    ap.add_argument("--gen-ms", type=float, default=200.0, help="simulated generation latency per request")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="trainer groups per step")
    ap.add_argument("--concurrency", type=int, default=8, help="episodes in flight per worker")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return
    t_start = time.perf_counter()
    details: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "args": {k: v for k, v in vars(args).items() if k in ("seconds", "s3", "gen_ms", "tokens", "group_size",
                                                               "batch", "concurrency")},
    }  # fmt: skip
    runs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rollflow-scale-") as tmp:
        if args.s3:
            with moto_server() as opts:
                Storage.open("s3://rollflow-scale/runs", "bench", "probe", opts).ensure_bucket()
                for n in (1, 2, 4):
                    runs[n] = run_workers(n, args, "s3://rollflow-scale/runs", opts)
        else:
            for n in (1, 2, 4):
                runs[n] = run_workers(n, args, str(Path(tmp) / "store"), {})
    figures = {f"groups_per_s_{n}": runs[n]["groups_per_s"] for n in (1, 2, 4)}
    figures["scale_2_over_1"] = runs[2]["groups_per_s"] / runs[1]["groups_per_s"]
    figures["scale_4_over_1"] = runs[4]["groups_per_s"] / runs[1]["groups_per_s"]
    figures["list_requests_per_step"] = runs[4]["list_requests_per_step"]
    details["runs"] = runs
    details["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = report("scale_s3" if args.s3 else "scale", figures, details)
    print(f"# wrote {out} in {details['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
