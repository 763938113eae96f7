"""The train flow: the trainer on committed shards, publishing checkpoints, on a GPU (or CPU) pool.

With train.distributed=fsdp2|ddp and train.nproc_per_node > 1 it launches the trainer under torchrun
(one process per GPU); otherwise it runs in the flow process. Run locally:
python -m flows.train --config configs/tiny_cpu.yaml
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.end_state import state_real_end_states
from flows.gpu_plan import torchrun_command
from rollflow.api.config import ExperimentConfig
from rollflow.trial.store import open_trial_storage
from tasks.bootstrap import bootstrap_model
from tasks.distributed import child_tracker
from tasks.runtime import (
    config_data,
    configure_process_env,
    core_logs_to_this_run,
    name_flow_run,
    resolve_config,
)
from tasks.train import train_loop


@task(name="train-torchrun", cache_policy=NO_CACHE, persist_result=False)
def train_torchrun(cfg: ExperimentConfig, config: str | None, overrides: list[str]) -> dict[str, Any]:
    """Run ``python -m rollflow.training.run`` under torchrun; rank 0 publishes checkpoints."""
    from storage.checkpoints import CheckpointStore

    cmd = torchrun_command(cfg, config, overrides)
    get_run_logger().info("launching: %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    done = CheckpointStore(open_trial_storage(cfg)).is_done()
    return dict(done or {})


@flow(name="train", log_prints=True)
def train(
    config: str | None = "configs/tiny_cpu.yaml",
    overrides: list[str] | None = None,
    settings: ExperimentConfig | None = None,
    mlflow_parent_run_id: str | None = None,
) -> dict[str, Any]:
    """Train on committed trajectories until train.steps, publishing checkpoints as it goes.

    Args:
        settings: the typed config (a form in the UI); replaces the YAML ``config`` when given.
        mlflow_parent_run_id: log the trainer's metrics into this MLflow run (the distributed parent's).
    """
    configure_process_env()
    state_real_end_states()  # a cancelled run's last line says Cancelled (flows/end_state.py)
    with core_logs_to_this_run():
        overrides = list(overrides or [])
        cfg = resolve_config(config, overrides, data=config_data(settings))
        configure_process_env(cfg)
        name_flow_run(f"train-{cfg.trial}")
        bootstrap_model(cfg)
        if cfg.train.distributed != "none" and (cfg.train.nproc_per_node > 1 or cfg.train.nnodes > 1):
            return train_torchrun(cfg, config, overrides)
        tracker = child_tracker(cfg, mlflow_parent_run_id, "train")
        return train_loop(cfg, metrics=tracker.sink if tracker else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    print(train(config=args.config, overrides=args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
