"""Trainer node k > 0 of a multi-node ``train`` flow run: the same torchrun agent as node 0, no flow.

With ``train.nnodes > 1`` the Kubernetes pool (infra/work_pools/kubernetes-gpu.json) starts one pod per
node for one flow run. Pod 0 runs the ``train`` flow, which launches its torchrun agent
(``flows/train.py``); a flow run can only be executed once, so pods 1..N-1 run this module instead. It
reads the flow run's parameters (``config``, ``overrides``) from the Prefect API
(``$PREFECT__FLOW_RUN_ID``, which the worker sets in every pod), resolves the config as the flow does and
runs the same ``torchrun_command``; the c10d rendezvous (``$ROLLFLOW_RDZV_ENDPOINT``, pod 0) gives each
agent its node rank. Its exit status is torchrun's.

What it is not: a flow (it creates no flow run and logs no metrics: global rank 0, on node 0, does) or a
scheduler. Run by the pod's command line: ``python -m flows.train_node``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from flows.gpu_plan import torchrun_command
from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import load_config
from rollflow.configuration.parameter_secrets import env_secret_overrides

FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"
logger = logging.getLogger("rollflow.train_node")


def flow_run_parameters(flow_run_id: str) -> dict[str, Any]:
    """The parameters the ``train`` flow run was created with."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return dict(client.read_flow_run(flow_run_id).parameters)


def node_command(parameters: dict[str, Any]) -> list[str]:
    """Node 0's torchrun line for these flow parameters (``flows/train.py`` resolves them the same way)."""
    config, overrides = parameters.get("config"), list(parameters.get("overrides") or [])
    settings = parameters.get("settings")
    cfg = load_config(
        None if settings else config, [*overrides, *env_secret_overrides()], data=settings or None
    )
    if cfg.train.nnodes < 2:
        raise ConfigError("train.nnodes", f"is {cfg.train.nnodes}: a node > 0 exists only when it is >= 2")
    return torchrun_command(cfg, config, overrides)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    flow_run_id = os.environ.get(FLOW_RUN_ENV, "").strip()
    if not flow_run_id:
        print(
            f"train_node: error: ${FLOW_RUN_ENV} is not set (the Prefect worker sets it in the pod)",
            file=sys.stderr,
        )
        return 2
    cmd = node_command(flow_run_parameters(flow_run_id))
    logger.info(
        "node %s of flow run %s: %s", os.environ.get("JOB_COMPLETION_INDEX", "?"), flow_run_id, " ".join(cmd)
    )
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
