"""Prefect flows over the core (``rollflow/``): ``async-rl``, ``rollout``, ``train``, ``evaluate``; the CLI.

Importing this package first creates the Prefect home the environment names (``PREFECT_HOME``), before
any flow module imports ``prefect`` (see ``rollflow.configuration.state_dirs``).
"""

from rollflow.configuration.state_dirs import ensure_state_dirs

ensure_state_dirs()
