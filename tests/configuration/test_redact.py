"""rollflow.configuration.redact and the config's secret-free views: by key, URL userinfo, Bearer, flag and value."""

from __future__ import annotations

import pytest

from rollflow.configuration.loader import flat_params, load_config, to_yaml
from rollflow.configuration.redact import (
    find_secrets,
    is_secret_key,
    redact_args,
    redact_text,
    redact_tree,
    redact_url,
)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True), ("apiKey", True), ("X-Api-Key", True), ("--api-key", True), ("key", True),
        ("aws_secret_access_key", True), ("session_token", True), ("hf_token", True),
        ("Authorization", True), ("password", True),
        ("max_tokens", False), ("stop_token_ids", False), ("tokenizer", False), ("endpoint_url", False),
        ("key_path", False), ("max_new_tokens", False),
    ],
)  # fmt: skip
def test_is_secret_key(name: str, secret: bool) -> None:
    assert is_secret_key(name) is secret


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://AKIA:s3cr3t@bucket/x", "s3://***@bucket/x"),
        ("http://user:p4ss@127.0.0.1:5000/", "http://***@127.0.0.1:5000/"),
        ("https://ghp_tokenonly@github.com/a", "https://***@github.com/a"),
        ("https://h/x?X-Amz-Signature=abc&a=1", "https://h/x?X-Amz-Signature=***&a=1"),
        ("https://h/x?token=abc", "https://h/x?token=***"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("runs/storage", "runs/storage"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_text_masks_urls_bearer_and_known_values() -> None:
    text = "GET s3://k:v4lue@b/x with Authorization: Bearer abc.def and hunter22 again"
    assert (
        redact_text(text, known=["hunter22"])
        == "GET s3://***@b/x with Authorization: Bearer *** and *** again"
    )
    assert redact_text("a basic sum; the token budget") == "a basic sum; the token budget"  # prose stays


def test_redact_args_masks_secret_flags() -> None:
    args = ["--api-key", "sk-123", "--port", "30000", "--token=abcd", "--admin-password", "pw99"]
    assert redact_args(args) == [
        "--api-key",
        "***",
        "--port",
        "30000",
        "--token=***",
        "--admin-password",
        "***",
    ]


def test_a_secret_seen_once_is_masked_everywhere() -> None:
    tree = {"headers": {"Authorization": "Bearer sk-live-1"}, "note": "copy of sk-live-1", "n": 3}
    assert "sk-live-1" in find_secrets(tree)
    assert redact_tree(tree) == {"headers": {"Authorization": "***"}, "note": "copy of ***", "n": 3}


LEAKS = {
    "AKIAURL": "storage.options={endpoint_url: 'http://AKIAURL:urlsecret1@127.0.0.1:9000'}",
    "urlsecret1": "storage.options={endpoint_url: 'http://AKIAURL:urlsecret1@127.0.0.1:9000'}",
    "dspass99": "dataset.path='s3://reader:dspass99@bucket/gsm8k/{split}.parquet'",
    "mlflowpw7": "tracking.mlflow_tracking_uri='https://me:mlflowpw7@mlflow.example.com'",
    "hdr-token-5": "rollout.workflow_kwargs={headers: {Authorization: 'Bearer hdr-token-5'}}",
    "sglang-key-3": "inference.sglang.extra_args=['--api-key', 'sglang-key-3', '--log-level', 'info']",
}


@pytest.mark.parametrize("secret", sorted(LEAKS))
def test_credentials_never_reach_params_or_the_logged_yaml(secret: str) -> None:
    cfg = load_config(
        overrides=[LEAKS[secret], "dataset.kind=files"] if "dataset" in LEAKS[secret] else [LEAKS[secret]]
    )
    params = flat_params(cfg)
    assert secret not in str(params) and secret not in to_yaml(cfg)
    assert "***" in str(params)


def test_redaction_keeps_what_is_not_secret() -> None:
    cfg = load_config(
        overrides=[
            "storage.options={endpoint_url: 'http://u:pw123456@127.0.0.1:9000', region: us-east-1}",
            "rollout.workflow_kwargs={max_turns: 3, stop_token_ids: [1, 2]}",
            "inference.sglang.extra_args=['--log-level', 'info']",
        ]
    )
    params = flat_params(cfg)
    assert params["storage.options.endpoint_url"] == "http://***@127.0.0.1:9000"
    assert params["storage.options.region"] == "us-east-1"
    assert params["rollout.workflow_kwargs.max_turns"] == "3"
    assert params["rollout.workflow_kwargs.stop_token_ids"] == "[1, 2]"
    assert params["inference.sglang.extra_args"] == "['--log-level', 'info']"
    assert params["rollout.generation.max_new_tokens"] == str(cfg.rollout.generation.max_new_tokens)
