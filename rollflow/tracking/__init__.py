"""Experiment tracking: MLflow runs, metrics sink, artifacts and the model registry."""
