"""The machinery around the config contract (``rollflow.api.config``): load, redact, refuse secrets.

What it is: ``loader`` (defaults <- YAML <- dotted overrides into a checked ``ExperimentConfig``, the flat
view for MLflow params, the generator of docs/configuration.md), ``redact`` (secrets out of anything
logged or stored) and ``parameter_secrets`` (credentials refused as Prefect flow parameters).
What it is not: the config fields themselves, which are a contract and live in ``rollflow/api/``.
"""
