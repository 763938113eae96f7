"""Credentials never become Prefect flow parameters (real Prefect server).

A flow given a secret in ``overrides`` or ``settings`` refuses before anything runs; the CLI's side channel
(``$ROLLFLOW_SECRET_OVERRIDES``) delivers a secret to the config while the flow run's parameters, as the
Prefect API stores them, hold no trace of it; distributed mode refuses command-line secrets, which its
deployment runs in other processes would never see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollflow.api.errors import ConfigError
from rollflow.configuration.parameter_secrets import SecretParameterError, secret_overrides_aside

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3tvalue-do-not-store"


def test_secret_overrides_and_settings_are_refused_before_anything_runs(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.async_rl import async_rl
    from rollflow.configuration.loader import load_config

    monkeypatch.chdir(ROOT)
    root = tmp_path / "storage"
    overrides = [f"storage.root={root}", f"storage.options={{key: AKIAEXAMPLE1, secret: {SECRET}}}"]
    with pytest.raises(SecretParameterError) as info:
        async_rl(config="configs/tiny_cpu.yaml", overrides=overrides)
    assert "storage.options.key" in str(info.value) and SECRET not in str(info.value)
    settings = load_config("configs/tiny_cpu.yaml", [f"storage.root={root}", f"inference.api_key={SECRET}"])
    with pytest.raises(SecretParameterError, match="inference.api_key"):
        async_rl(settings=settings)
    assert not root.exists()  # nothing was written


def test_cli_secrets_reach_the_config_but_not_the_stored_parameters(
    use_prefect_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tasks.runtime import resolve_config

    @flow(name="secret-probe")
    def probe(overrides: list[str]) -> dict[str, Any]:
        return dict(resolve_config("configs/tiny_cpu.yaml", overrides).storage.options)

    monkeypatch.chdir(ROOT)
    with secret_overrides_aside(["train.steps=3", f"storage.options={{secret: {SECRET}}}"]) as public:
        state = probe(public, return_state=True)
    assert state.is_completed(), state
    assert state.result()["secret"] == SECRET  # the config got it ...
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.parameters == {"overrides": ["train.steps=3"]}  # ... the Prefect database did not
    assert SECRET not in repr(run)


def test_distributed_mode_refuses_command_line_secrets(
    use_prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.async_rl import async_rl

    monkeypatch.chdir(ROOT)
    items = [
        f"storage.root={tmp_path / 'st'}",
        "orchestration.mode=distributed",
        f"inference.api_key={SECRET}",
    ]
    with secret_overrides_aside(items) as public, pytest.raises(ConfigError, match="other processes"):
        async_rl(config="configs/tiny_cpu.yaml", overrides=public)
    assert not (tmp_path / "st").exists()
