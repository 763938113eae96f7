"""Prefect @task adapters: each builds core objects from config, calls the core, returns references.

No RL math and no Parquet code lives here; see rollflow/ for that.
"""
