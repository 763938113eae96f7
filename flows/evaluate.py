"""The evaluate flow: score one committed checkpoint version on a dataset split.

It fetches and verifies the checkpoint, serves it on a private inference server, scores the split
greedily and writes a Prefect table artifact (and the accuracy as the flow's result). The score is
recorded under the checkpoint's version (``eval/v{N}.json``), never the private server's starting
version 0, so the trial's 'before' score stays as it was. The trial's recorded config (``record/config.json``)
is what it scores with, so the held-out set is the one the trial was scored on; overrides go on top.
Run locally: python -m flows.evaluate --config configs/tiny_cpu.yaml --version 20
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from prefect import flow

from flows.run_name import evaluate_run_name
from rollflow.api.config import ExperimentConfig
from rollflow.trial.resume_policy import recorded_config
from rollflow.trial.store import open_trial_storage
from storage.checkpoints import CheckpointStore
from tasks.bootstrap import bootstrap_model
from tasks.evaluate import evaluate_policy
from tasks.runtime import (
    config_data,
    configure_process_env,
    core_logs_to_this_run,
    name_flow_run,
    resolve_config,
)
from tasks.servers import start_servers, stop_servers


@flow(
    name="evaluate",
    flow_run_name=evaluate_run_name,  # evaluate-<trial>-v<N> from the first log line (flows/run_name.py)
    log_prints=True,
)
def evaluate(
    config: str | None = "configs/tiny_cpu.yaml",
    overrides: list[str] | None = None,
    version: int = -1,
    split: str | None = None,
    settings: ExperimentConfig | None = None,
) -> dict[str, Any]:
    """Score checkpoint ``version`` (-1 = latest committed) on ``split`` (default: dataset.eval_split)."""
    from prefect.runtime import flow_run

    configure_process_env()
    with core_logs_to_this_run():
        resolved = resolve_config(config, overrides or [], data=config_data(settings))
        cfg = recorded_config(resolved, overrides or [])  # what the trial trained with (its eval set)
        configure_process_env(cfg)
        store = CheckpointStore(open_trial_storage(cfg))
        version = _resolve_version(store, version)
        name = f"evaluate-{cfg.trial}-v{version}"
        if flow_run.name != name:  # named at start from LATEST; a damaged one resolved to another version
            name_flow_run(name)
        local = _checkpoint_dir(cfg, store, version)
        eval_cfg = dataclasses.replace(
            cfg,
            inference=dataclasses.replace(cfg.inference, backend="local", n_servers=1),
            eval=dataclasses.replace(cfg.eval, split=split or cfg.eval.split),
            model=dataclasses.replace(cfg.model, path=str(local)),
        )
        servers = start_servers(eval_cfg, str(local))
        try:
            # the server starts at weight version 0 whatever it loaded: the record is the checkpoint's
            result = evaluate_policy(
                eval_cfg, servers.addresses, label=f"v{version}", min_version=0, scored_version=version
            )
        finally:
            stop_servers(servers)
        return {k: v for k, v in result.items() if k != "rows"} | {"checkpoint_version": version}


def _resolve_version(store: CheckpointStore, version: int) -> int:
    """``version``, or for -1 the newest committed one (``CheckpointNotFoundError`` when there is none)."""
    from storage.errors import CheckpointNotFoundError

    if version >= 0:
        return version
    latest = store.resolve_latest()
    if latest is None:
        raise CheckpointNotFoundError(f"no committed checkpoint under {store.storage.root_uri}; train first")
    return latest.version


def _checkpoint_dir(cfg: ExperimentConfig, store: CheckpointStore, version: int) -> Path:
    """A local directory holding checkpoint ``version`` as a full model (a LoRA adapter merged)."""
    collected_v0 = version == 0 and 0 not in store.list_committed()
    if collected_v0:  # retention removed v0's checkpoint: v0 is the model.path the trial recorded
        return Path(bootstrap_model(cfg))
    local = store.fetch(version, Path(cfg.storage.local_cache) / cfg.experiment / cfg.trial)
    if store.get(version).is_adapter:  # LoRA: serve base + adapter, merged
        from rollflow.training.lora import merge_adapter_dir

        local = merge_adapter_dir(cfg.model.path, local, local.with_name(f"{local.name}-merged"))
    return local


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml")
    parser.add_argument("--version", type=int, default=-1)
    parser.add_argument("--split", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    print(evaluate(config=args.config, overrides=args.overrides, version=args.version, split=args.split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
