"""`rollflow.configuration.parameter_secrets`: which parameters are credentials, and the CLI's side channel."""

from __future__ import annotations

import json
import os

import pytest

from rollflow.api.errors import ConfigError
from rollflow.configuration.parameter_secrets import (
    SECRET_OVERRIDES_ENV,
    SecretParameterError,
    env_secret_overrides,
    refuse_secret_parameters,
    secret_overrides_aside,
    secret_parameter_paths,
    split_secret_overrides,
)


def test_credentials_are_found_by_key_url_and_flag_and_nothing_else() -> None:
    overrides = [
        "train.steps=5",
        "storage.options={key: AKIAEXAMPLE, secret: s3cr3t, endpoint_url: 'http://127.0.0.1:9000'}",
        "inference.api_key=abcd1234",
        "dataset.path=s3://user:pw123456@bucket/data.jsonl",
        "inference.sglang.extra_args=[--api-key, zzzz1234]",
        "rollout.generation.stop_token_ids=[1, 2]",
        "tracking.mlflow_tracking_uri=http://127.0.0.1:5000",
        "rollout.workflow_kwargs={headers: {Authorization: Bearer tok123456}}",
    ]
    assert secret_parameter_paths(overrides) == [
        "storage.options.key",
        "storage.options.secret",
        "inference.api_key",
        "dataset.path",
        "inference.sglang.extra_args",
        "rollout.workflow_kwargs.headers.Authorization",
    ]
    # the typed settings tree: unset secret fields are not credentials
    data = {"inference": {"api_key": None}, "storage": {"options": {"region": "us-east-1", "key": ""}}}
    assert secret_parameter_paths([], data) == []
    assert secret_parameter_paths([], {"inference": {"api_key": "abcd1234"}}) == ["inference.api_key"]


def test_refusal_names_the_paths_and_never_the_values() -> None:
    with pytest.raises(SecretParameterError) as info:
        refuse_secret_parameters(["train.steps=5", "storage.options={secret: s3cr3tvalue}"])
    msg = str(info.value)
    assert "storage.options.secret" in msg and "AWS_SECRET_ACCESS_KEY" in msg
    assert "s3cr3tvalue" not in msg
    refuse_secret_parameters(["train.steps=5"])  # nothing secret: no error


def test_cli_side_channel_round_trip_and_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_OVERRIDES_ENV, raising=False)
    items = ["train.steps=5", "inference.api_key=abcd1234"]
    assert split_secret_overrides(items) == (["train.steps=5"], ["inference.api_key=abcd1234"])
    with secret_overrides_aside(items) as public:
        assert public == ["train.steps=5"]
        assert env_secret_overrides() == ["inference.api_key=abcd1234"]
    assert SECRET_OVERRIDES_ENV not in os.environ
    with secret_overrides_aside(["train.steps=5"]) as public:  # nothing secret: the variable stays unset
        assert public == ["train.steps=5"] and SECRET_OVERRIDES_ENV not in os.environ


@pytest.mark.parametrize("raw", ["{not json", json.dumps({"a": 1}), json.dumps([1, 2])])
def test_malformed_side_channel_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=SECRET_OVERRIDES_ENV):
        env_secret_overrides({SECRET_OVERRIDES_ENV: raw})
