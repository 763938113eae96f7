"""The main flow: fully asynchronous RL on one config.

Embedded mode (one machine): bootstrap the policy, start the inference servers, score the base
policy, then run the rollout loop, the train loop and the periodic evaluation concurrently; when the
trainer writes its done marker everything stops, the final policy is scored and registered in MLflow,
and a summary comes back (final version, accuracies, MLflow run id, storage URIs).
Distributed mode (``flows/distributed.py``): the same story, with the train loop and N rollout workers
as `train` and `rollout` deployment runs on their work pools, sharing the storage root and MLflow run.

Run it:  python -m flows.async_rl --config configs/tiny_cpu.yaml train.steps=20
   or:   prefect deployment run 'async-rl/local' --param overrides='["train.steps=20"]'
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from flows.distributed import run_distributed
from rollflow.api.config import ExperimentConfig
from tasks.bootstrap import bootstrap_model
from tasks.evaluate import eval_loop, evaluate_policy
from tasks.loops import join_loops
from tasks.rollout import rollout_loop
from tasks.runtime import configure_process_env, resolve_config
from tasks.servers import start_servers, stop_servers
from tasks.tracking import markdown_artifact, table_artifact
from tasks.train import train_loop

DEFAULT_CONFIG = "configs/tiny_cpu.yaml"


def _summary_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# async-rl: {summary['experiment']} / {summary['trial']}",
        "",
        "| | |",
        "| --- | --- |",
        f"| final policy version | {summary['final_version']} |",
        f"| eval accuracy before | {summary['eval_accuracy_before']:.3f} |",
        f"| eval accuracy after | {summary['eval_accuracy_after']:.3f} |",
        f"| groups trained on | {summary['train'].get('groups_consumed', '?')} |",
        f"| stale groups dropped | {summary['train'].get('dropped_stale', '?')} |",
        f"| wall time | {summary['wall_s']:.0f} s |",
        f"| storage | `{summary['storage_uri']}` |",
        f"| MLflow run | {summary['mlflow_run_url']} |",
        f"| registered model | {summary.get('registered_model') or '-'} |",
    ]
    return "\n".join(lines)


def _run_embedded(cfg: ExperimentConfig, tracker: Any, logger: Any) -> dict[str, Any]:
    sink = tracker.sink if tracker else None
    model_path = bootstrap_model(cfg)
    servers = start_servers(cfg, model_path)
    stop = threading.Event()
    try:
        before = evaluate_policy(cfg, servers.addresses, label="before", min_version=0, metrics=sink)
        train_f = train_loop.submit(cfg, metrics=sink, stop_event=stop, pause_addresses=servers.addresses)
        rollout_f = rollout_loop.submit(cfg, servers.addresses, metrics=sink, stop_event=stop, fleet=servers)
        evals_f = eval_loop.submit(cfg, servers.addresses, metrics=sink, stop_event=stop)
        done = join_loops({"train-loop": train_f, "rollout-loop": rollout_f, "eval-loop": evals_f}, stop)
        train, rollout = done["train-loop"], done["rollout-loop"]
        after = evaluate_policy(
            cfg, servers.addresses, label="after", min_version=int(train["final_version"]), metrics=sink
        )
    finally:
        stop.set()
        stop_servers(servers)
    return {"before": before, "after": after, "train": train, "rollout": rollout}


@flow(
    name="async-rl",
    flow_run_name="async-rl-{trial_name}",
    task_runner=ThreadPoolTaskRunner(max_workers=8),
    log_prints=True,
)
def async_rl(
    config: str | None = DEFAULT_CONFIG,
    overrides: list[str] | None = None,
    trial_name: str = "from-config",
    retrain_from_registry: bool = False,
) -> dict[str, Any]:
    """Fully asynchronous GRPO/PPO: rollout and training concurrently, meeting only through storage.

    Args:
        config: path of an experiment YAML (relative to the project dir).
        overrides: dotted overrides, e.g. ["train.steps=20", "rollout.max_staleness=0"].
        trial_name: trial name; "from-config" keeps the config's, "{date}" becomes today's date.
        retrain_from_registry: start from the newest policy registered in MLflow (nightly retrain).
    """
    configure_process_env()
    logger = get_run_logger()
    overrides = list(overrides or [])
    if trial_name != "from-config":
        overrides.append(f"trial={trial_name.replace('{date}', time.strftime('%Y%m%d-%H%M'))}")
    cfg = resolve_config(config, overrides)
    if retrain_from_registry:
        cfg = _from_registry(cfg, logger)
    t0 = time.monotonic()

    tracker = None
    if cfg.tracking.enabled:
        from rollflow.tracking.mlflow_tracker import MlflowTracker

        tracker = MlflowTracker(cfg)
        tracker.start(tags={"rollflow.mode": cfg.orchestration.mode})
    from storage.fs import Storage

    storage_uri = Storage.open(cfg.storage.root, cfg.experiment, cfg.trial, cfg.storage.options).root_uri
    status = "FAILED"
    try:
        if cfg.orchestration.mode == "distributed":
            parts = run_distributed(cfg, {"config": config, "overrides": overrides}, tracker)
        else:
            parts = _run_embedded(cfg, tracker, logger)
        summary: dict[str, Any] = {
            "experiment": cfg.experiment,
            "trial": cfg.trial,
            "final_version": int(parts["train"]["final_version"]),
            "eval_accuracy_before": parts["before"]["accuracy"],
            "eval_accuracy_after": parts["after"]["accuracy"],
            "train": {k: v for k, v in parts["train"].items() if not isinstance(v, (list, dict))},
            "rollout": {k: v for k, v in parts["rollout"].items() if not isinstance(v, (list, dict))},
            "storage_uri": storage_uri,
            "mlflow_run_id": tracker.run_id if tracker else None,
            "mlflow_run_url": tracker.run_url if tracker else "-",
            "wall_s": time.monotonic() - t0,
        }
        if tracker:
            summary["registered_model"] = _finish_tracking(cfg, tracker, parts, summary)
        markdown_artifact(_summary_markdown(summary), key="async-rl-summary", description="Run summary")
        status = "FINISHED"
        return summary
    finally:
        if tracker:
            tracker.finish(status)


def _finish_tracking(
    cfg: ExperimentConfig, tracker: Any, parts: dict[str, Any], summary: dict[str, Any]
) -> str | None:
    from rollflow.rollout.inspect import sample_trajectories
    from storage.checkpoints import CheckpointStore
    from storage.fs import Storage

    tracker.log_dict({k: v for k, v in summary.items()}, "summary.json")
    tracker.log_table(parts["after"]["rows"][:100], "eval/after.json")
    tracker.log_table(parts["before"]["rows"][:100], "eval/before.json")
    storage = Storage.open(cfg.storage.root, cfg.experiment, cfg.trial, cfg.storage.options)
    samples = sample_trajectories(storage, cfg.model.path, limit=cfg.tracking.n_sample_trajectories)
    tracker.log_table(samples, "trajectories/samples.json")
    table_artifact(samples[:20], key="sample-trajectories", description="Decoded sample trajectories")
    tracker.log_curves_png()
    if not cfg.tracking.register_model:
        return None
    store = CheckpointStore(storage)
    final = summary["final_version"]
    local = store.fetch(final, f"{cfg.storage.local_cache}/{cfg.experiment}/{cfg.trial}")
    registry_version = tracker.register_checkpoint(
        local, version=final, extra_tags={"eval_accuracy": f"{summary['eval_accuracy_after']:.4f}"}
    )
    return f"{tracker.model_name} v{registry_version}"


def _from_registry(cfg: ExperimentConfig, logger: Any) -> ExperimentConfig:
    """Nightly retrain: start from the newest registered policy, on a fresh synthetic draw."""
    import dataclasses

    from rollflow.tracking.mlflow_tracker import MlflowTracker, download_latest_registered

    tracker = MlflowTracker(cfg)
    local, tags = download_latest_registered(
        tracker.tracking_uri, tracker.model_name, f"{cfg.storage.local_cache}/registry/{cfg.trial}"
    )
    logger.info("retraining from registered %s (tags %s) at %s", tracker.model_name, tags, local)
    model = dataclasses.replace(cfg.model, path=str(local), bootstrap_tiny=False)
    dataset = cfg.dataset
    if dataset.kind == "synthetic":  # fresh data: a new draw of the synthetic task per retrain
        dataset = dataclasses.replace(
            dataset, synthetic=dataclasses.replace(dataset.synthetic, seed=int(time.strftime("%Y%m%d")))
        )
    return dataclasses.replace(cfg, model=model, dataset=dataset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the async-rl flow locally (Prefect ephemeral API).")
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=20")
    args = parser.parse_args(argv)
    summary = async_rl(config=args.config, overrides=args.overrides)
    print()
    print(f"eval_accuracy_before {summary['eval_accuracy_before']:.3f}")
    print(f"eval_accuracy_after {summary['eval_accuracy_after']:.3f}")
    print(f"final_version {summary['final_version']}  wall_s {summary['wall_s']:.0f}")
    print(f"storage: {summary['storage_uri']}")
    print(f"MLflow:  {summary['mlflow_run_url']}")
    print("  UI:    .venv/bin/mlflow ui --backend-store-uri sqlite:///runs/mlflow/mlflow.db --port 5000")
    print("Prefect: .venv/bin/prefect server start  (then open http://127.0.0.1:4200 to browse flow runs)")
    print(
        f"Trajectories: .venv/bin/python -m rollflow.rollout.inspect --config {args.config} trial={summary['trial']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
