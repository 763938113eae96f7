"""Command line entry of the trainer, for one process or under torchrun.

Run it:

    python -m rollflow.training.run --config configs/tiny_cpu.yaml train.steps=20
    torchrun --nproc_per_node 2 -m rollflow.training.run --config FILE train.distributed=ddp   # CPU/gloo
    torchrun --nproc_per_node 8 -m rollflow.training.run --config FILE train.distributed=fsdp2 # GPUs

What it is: config loading (YAML + dotted overrides), logging, SIGTERM/SIGINT -> a graceful stop (finish
the step, write a resume point, exit 0 without the done marker), an optional JSON-lines metrics file,
and the run summary printed as one JSON line by rank 0. Exit codes: 0 finished or stopped, 1 trainer
error, 2 bad config. Under torchrun (``WORLD_SIZE`` > 1) a rank leaves with ``os._exit`` once its work
is committed and its output flushed. A finished 2-rank FSDP2 run on CPU had a rank abort at exit
("terminate called without an active exception", SIGABRT; about 1 run in 20 on a loaded machine), which
torchrun reports as a failed job; gloo's worker threads can still hold tensors that need the GIL while the
interpreter tears down (pytorch/pytorch#179291 describes the same abort). Skipping the teardown is safe
here: the group is destroyed, checkpoints and the resume point are committed, logs are flushed.
What it is not: a launcher; torchrun (or the Prefect train task) starts the processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rollflow.api.errors import ConfigError, TrainerError
from rollflow.trial.store import open_trial_storage


class JsonlSink:
    """MetricsSink appending ``{"step": s, **metrics}`` lines to a file (rank 0 only logs)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        line = json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}})
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollflow.training.run", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", help="experiment YAML (defaults if omitted)")
    parser.add_argument("--metrics-jsonl", help="append per-step metrics to this file")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5")
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    from rollflow.configuration.loader import load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from rollflow.training.warm_start_reuse import trainer_class

    Trainer = trainer_class(cfg)  # noqa: N806  # the plain Trainer unless train.warm_start_from is set
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).warning("signal %d: stopping after the current step", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    storage = open_trial_storage(cfg)
    sink = JsonlSink(args.metrics_jsonl) if args.metrics_jsonl and rank == 0 else None
    try:
        summary = Trainer(cfg, storage, metrics=sink, stop_event=stop).run()
    except TrainerError as e:
        logging.getLogger(__name__).error("trainer failed: %s", e)
        return 1
    except ConfigError as e:  # train.warm_start_from names a trial it cannot reuse
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rank == 0:
        print(json.dumps(dataclasses.asdict(summary)), flush=True)
    return 0


def _exit(code: int) -> None:
    """Leave now under torchrun (module docstring), after flushing logs and output; else return."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    status = main()
    _exit(status)
    raise SystemExit(status)
