"""Prefect flows over the core (``rollflow/``): ``async-rl``, ``rollout``, ``train``, ``evaluate``; the CLI.

Importing this package first creates the Prefect home the environment names (``PREFECT_HOME``), before
any flow module imports ``prefect`` (see ``rollflow.configuration.state_dirs``).
"""

from rollflow.configuration.state_dirs import ensure_state_dirs

ensure_state_dirs()


def __getattr__(name: str) -> object:  # `from flows import RLRun` without importing it for every flow
    if name == "RLRun":
        from flows.session import RLRun

        return RLRun
    raise AttributeError(name)
