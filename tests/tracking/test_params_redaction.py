"""Credentials in URLs, headers and argument lists never reach a real MLflow store (SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollflow.configuration.loader import load_config
from rollflow.tracking.mlflow_tracker import MlflowTracker

SECRETS = ("AKIAURL7", "urlsecret1", "dspass99", "hdr-token-5", "sglang-key-3", "apikey-top-1")


def test_mlflow_params_and_logged_yaml_hold_no_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(
        overrides=[
            "experiment=redact-test",
            "storage.options={endpoint_url: 'http://AKIAURL7:urlsecret1@127.0.0.1:9000'}",
            "dataset.kind=files",
            "dataset.path='s3://reader:dspass99@bucket/gsm8k/{split}.parquet'",
            "rollout.workflow_kwargs={headers: {Authorization: 'Bearer hdr-token-5'}}",
            "inference.sglang.extra_args=['--api-key', 'sglang-key-3']",
            "inference.api_key=apikey-top-1",
        ]
    )
    tracker = MlflowTracker(cfg, base_dir=tmp_path / "mlflow")
    run_id = tracker.start()
    tracker.finish()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracker.tracking_uri)
    params = client.get_run(run_id).data.params
    yaml_path = client.download_artifacts(run_id, "config/resolved.yaml", str(tmp_path / "dl"))
    logged = json.dumps(params) + Path(yaml_path).read_text()
    for secret in SECRETS:
        assert secret not in logged, secret
    assert params["storage.options.endpoint_url"] == "http://***@127.0.0.1:9000"
