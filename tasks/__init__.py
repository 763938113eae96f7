"""Prefect @task adapters: each builds core objects from config, calls the core, returns references.

No RL math and no Parquet code lives here; see rollflow/ for that.

Importing this package first creates the Prefect home the environment names (``PREFECT_HOME``), before any
task module imports ``prefect`` (see ``rollflow.configuration.state_dirs``).
"""

from rollflow.configuration.state_dirs import ensure_state_dirs

ensure_state_dirs()
