"""Process-level setup shared by every flow: env defaults, the resolved config, run names and logs.

What it is:
- ``configure_process_env``: telemetry off (always) and, only for a config that needs no hub (the
  embedded default: a bootstrapped or local model and a non-hub dataset), ``HF_HUB_OFFLINE`` and
  ``TRANSFORMERS_OFFLINE``; each is a ``setdefault``, so the user's environment wins.
- ``resolve_config``: the typed config (a form in the Prefect UI) or a YAML path, plus dotted
  overrides, validated into an ``ExperimentConfig``, shown as the markdown artifact ``resolved-config``
  and logged at DEBUG (secrets redacted; MLflow keeps it too, as params and an artifact). Parameters that hold
  a credential are refused (``SecretParameterError``: Prefect stores parameters in plain text); the
  overrides in ``$ROLLFLOW_SECRET_OVERRIDES`` (where the CLI puts secret ones) go on top.
- ``name_flow_run``: renames the current flow run (``async-rl-{trial}``) once the trial is known.
- ``core_logs_to_this_run``: sends the core's loggers (``rollflow``, ``storage``, ``infra``) to the
  Prefect run logs while a flow's body runs, without ``PREFECT_LOGGING_EXTRA_LOGGERS``, and puts them
  back as they were when it ends.
What it is not: anything that touches storage or servers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rollflow.api.config import ExperimentConfig
from rollflow.configuration.loader import load_config, to_yaml
from rollflow.configuration.parameter_secrets import env_secret_overrides, refuse_secret_parameters

if TYPE_CHECKING:
    from prefect.states import State

T = TypeVar("T")
# What ``get_run_logger()`` returns: a flow or task run's logger (an adapter over Prefect's).
RunLogger: TypeAlias = "logging.Logger | logging.LoggerAdapter[logging.Logger]"

TELEMETRY_ENV = {
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
}
HUB_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
CORE_LOGGERS = ("rollflow", "storage", "infra")


def needs_hub(cfg: ExperimentConfig) -> bool:
    """True when the config names a model or dataset that only a hub can provide."""
    from pathlib import Path

    model_on_hub = not cfg.model.bootstrap_tiny and not Path(cfg.model.path).exists()
    return model_on_hub or cfg.dataset.kind == "hub"


def process_env_defaults(cfg: ExperimentConfig | None) -> dict[str, str]:
    """The defaults ``configure_process_env`` applies for ``cfg`` (None: telemetry only)."""
    env = dict(TELEMETRY_ENV)
    if cfg is not None and not needs_hub(cfg):
        env.update(HUB_OFFLINE_ENV)
    return env


def configure_process_env(cfg: ExperimentConfig | None = None) -> None:
    """Set the defaults of ``process_env_defaults`` unless the user chose otherwise."""
    for key, value in process_env_defaults(cfg).items():
        os.environ.setdefault(key, value)


def config_data(settings: ExperimentConfig | dict[str, Any] | None) -> dict[str, Any] | None:
    """The typed config parameter as a plain tree for ``load_config(data=...)``."""
    if settings is None:
        return None
    if isinstance(settings, dict):
        return settings
    from rollflow.configuration.loader import to_dict

    return to_dict(settings)


@task(name="resolve-config", cache_policy=NO_CACHE, persist_result=False)
def resolve_config(
    config: str | None, overrides: list[str] | None = None, data: dict[str, Any] | None = None
) -> ExperimentConfig:
    """``data`` (the typed config) replaces the YAML file when given; overrides go on top, then the
    secret overrides of ``$ROLLFLOW_SECRET_OVERRIDES``. Raises ``SecretParameterError`` when ``overrides``
    or ``data`` (flow parameters) hold a credential."""
    refuse_secret_parameters(overrides or [], data)
    secret = env_secret_overrides()
    cfg = load_config(None if data is not None else config, [*(overrides or []), *secret], data=data)
    text = to_yaml(cfg)  # secrets redacted
    get_run_logger().debug("resolved config (secrets redacted):\n%s", text)
    try:
        from tasks.tracking import markdown_artifact

        markdown_artifact(f"```yaml\n{text}```\n", key="resolved-config", description="The resolved config")
    except Exception as exc:  # noqa: BLE001 (a UI nicety: never the reason a run fails)
        get_run_logger().debug("resolved-config artifact not created: %s", exc)
    return cfg


def name_flow_run(name: str) -> None:
    """Rename the current flow run (no-op outside one)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)


def flow_run_lineage() -> dict[str, str]:
    """Tags that link an MLflow run to the current Prefect flow run (id, name, UI link). The link is the
    one Prefect's "View at" line gives, and only to a server with a UI: none for the ephemeral API or the
    private one of a command-line run (``flows.local_api`` empties ``PREFECT_UI_URL``)."""
    from prefect.runtime import deployment, flow_run
    from prefect.utilities.urls import url_for

    if not flow_run.id:
        return {}
    tags = {"prefect.flow_run_id": str(flow_run.id)}
    # url_for, not prefect.runtime's flow_run.ui_url: that one builds /flow-runs/flow-run/<id>, a page
    # Prefect 3's UI does not have (its route is /runs/flow-run/<id>)
    url = url_for("flow-run", obj_id=str(flow_run.id))
    if url:
        tags["prefect.flow_run_url"] = url
    if deployment.id:
        tags["prefect.deployment"] = f"{flow_run.flow_name}/{deployment.name}"
    return tags


def is_interruption(exc: BaseException) -> bool:
    """True for a cancel, SIGTERM or Ctrl-C (MLflow: KILLED), False for a failure (FAILED)."""
    from prefect.exceptions import CancelledRun, PrefectSignal, TerminationSignal

    return isinstance(
        exc,
        (
            KeyboardInterrupt,
            SystemExit,
            asyncio.CancelledError,
            TerminationSignal,
            PrefectSignal,
            CancelledRun,
        ),
    )


def interrupted(data: Mapping[str, Any], message: str) -> State:
    """The final state of a loop task that was stopped before its work was done: Cancelled (with
    its partial summary as data), so the UI does not show an interrupted loop as Completed."""
    from prefect.states import Cancelled

    return Cancelled(message=message, data=data)


class _RunLogHandler(logging.Handler):
    """Forward to Prefect's handlers with the flow run id stamped on, so lines from the core's
    background threads (checkpoint publisher, weight watcher) reach the run's logs too."""

    def __init__(self, targets: list[logging.Handler], flow_run_id: str) -> None:
        super().__init__()
        self.targets = targets
        self.flow_run_id = flow_run_id

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "flow_run_id", None) is None:
            record.flow_run_id = self.flow_run_id
        for target in self.targets:
            if record.levelno >= target.level:
                target.handle(record)


@contextlib.contextmanager
def core_logs_to_this_run(level: int = logging.INFO) -> Iterator[None]:
    """While the block runs, send the core's loggers to this flow run's Prefect logs (what
    PREFECT_LOGGING_EXTRA_LOGGERS does, plus the run id for lines logged outside the flow's context).

    On exit the handler and the logger levels are put back as they were: in one process (a notebook, a
    test session) a later line outside any flow run is not filed under a finished run, and a subflow
    hands its parent's handler back. Outside a flow run it does nothing.
    """
    from prefect.runtime import flow_run

    if not flow_run.id:
        yield
        return
    handler = _RunLogHandler(list(logging.getLogger("prefect.extra").handlers), str(flow_run.id))
    saved: dict[str, tuple[int, list[logging.Handler]]] = {}
    for name in CORE_LOGGERS:
        logger = logging.getLogger(name)
        outer = [h for h in logger.handlers if isinstance(h, _RunLogHandler)]
        saved[name] = (logger.level, outer)
        for h in outer:
            logger.removeHandler(h)  # an enclosing flow run's, put back on exit
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > level:
            logger.setLevel(level)
    try:
        yield
    finally:
        for name, (old_level, outer) in saved.items():
            logger = logging.getLogger(name)
            logger.removeHandler(handler)
            for h in outer:
                logger.addHandler(h)
            logger.setLevel(old_level)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that also works where an event loop already runs in this thread (Jupyter):
    the coroutine then runs on a fresh loop in a helper thread and this thread waits for it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollflow-sync") as pool:
        return pool.submit(asyncio.run, coro).result()
