"""The rollout flow: inference servers + checkpoint watcher + rollout loop, on a GPU (or CPU) pool.

Deployed as `rollout/gpu` beside `train/gpu`; both share one storage root. It stops when the
trainer writes its done marker. Run locally: python -m flows.rollout --config configs/tiny_cpu.yaml
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.end_state import state_real_end_states
from rollflow.api.config import ExperimentConfig
from tasks.bootstrap import bootstrap_model
from tasks.distributed import child_tracker, rollout_name, writer_name_for
from tasks.rollout import rollout_loop
from tasks.runtime import (
    config_data,
    configure_process_env,
    core_logs_to_this_run,
    name_flow_run,
    resolve_config,
)
from tasks.servers import start_servers, stop_servers


@flow(name="rollout", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)
def rollout(
    config: str | None = "configs/tiny_cpu.yaml",
    overrides: list[str] | None = None,
    settings: ExperimentConfig | None = None,
    worker_index: int | None = None,
    mlflow_parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Generate and commit trajectory shards until the trainer is done.

    Args:
        settings: the typed config (a form in the UI); replaces the YAML ``config`` when given.
        worker_index: this worker's index among the trial's rollout workers (its writer id and run name
            ``rollout-{trial}-w{worker_index}``); set by the distributed async-rl parent.
        mlflow_parent_run_id: log metrics into a run nested under this MLflow run.
    """
    configure_process_env()
    state_real_end_states()  # a cancelled run's last line says Cancelled (flows/end_state.py)
    with core_logs_to_this_run():
        cfg = resolve_config(config, overrides or [], data=config_data(settings))
        configure_process_env(cfg)
        name_flow_run(f"rollout-{cfg.trial}-w{worker_index or 0}")
        tracker = child_tracker(cfg, mlflow_parent_run_id, rollout_name(worker_index or 0))
        status = "FAILED"
        model_path = bootstrap_model(cfg)
        servers = start_servers(cfg, model_path)
        try:
            writer = None if worker_index is None else writer_name_for(worker_index)
            sink = tracker.sink if tracker else None
            out = rollout_loop(cfg, servers.addresses, fleet=servers, metrics=sink, writer_name=writer)
            status = "FINISHED"
            return out
        finally:
            stop_servers(servers)
            if tracker:
                tracker.finish(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    print(rollout(config=args.config, overrides=args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
