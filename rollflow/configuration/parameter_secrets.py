"""Credentials must not travel as flow parameters: find them, and carry a command line's secrets aside.

What it is:
- ``secret_parameter_paths(overrides, data)``: the dotted paths of the values in a flow's parameters
  (``overrides``, the typed ``settings`` tree) that are credentials, by the rules of
  ``rollflow.configuration.redact`` (a secret-named key such as ``storage.options.secret`` or ``inference.api_key``,
  URL userinfo ``s3://AKIA:pw@...``, ``Bearer ...``, a ``--api-key`` flag in an argument list). Prefect
  stores flow parameters in plain text in its database and shows them in the UI, so the flows refuse
  such parameters (``SecretParameterError``) before anything runs.
- ``split_secret_overrides(overrides)``: a command line's overrides split into the public ones (passed as
  parameters) and the secret ones, which the CLI hands to its own in-process flow run through the
  environment variable ``ROLLFLOW_SECRET_OVERRIDES`` (a JSON list; ``secret_overrides_aside``);
  ``env_secret_overrides()`` reads it. Work in other processes (distributed mode's deployment runs)
  never sees it, so the parent refuses it there (``refuse_secret_overrides_for_other_processes``).

Worked example: ``["train.steps=5", "storage.options={key: AKIAX, secret: s3cr3t}"]`` ->
paths ``["storage.options.key", "storage.options.secret"]``; split -> (``["train.steps=5"]``,
``["storage.options={key: AKIAX, secret: s3cr3t}"]``).

What it is not: the redaction of logs and MLflow params (``redact``), nor a secret store: the place for
credentials is the environment (``AWS_*``, ``ROLLFLOW_INFERENCE_API_KEY``), a Prefect Secret block
exported through the work pool's ``env``, or the experiment YAML on the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rollflow.api.errors import ConfigError
from rollflow.configuration.loader import parse_override
from rollflow.configuration.redact import find_secrets, is_secret_key

SECRET_OVERRIDES_ENV = "ROLLFLOW_SECRET_OVERRIDES"


class SecretParameterError(ConfigError):
    """A flow parameter holds a credential, which Prefect would store in plain text."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(
            ", ".join(paths),
            "a credential was passed as a flow parameter, and Prefect keeps flow parameters in plain text "
            "in its database and UI. Take it from the environment instead (AWS_ACCESS_KEY_ID / "
            "AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL for S3, ROLLFLOW_INFERENCE_API_KEY for the "
            "servers), a Prefect Secret block exported in the work pool's `env` job variable, or the "
            "experiment YAML on the worker; the `rollflow` CLI keeps secret overrides out of the "
            f"parameters by itself (through ${SECRET_OVERRIDES_ENV}). Nothing was run.",
        )


def _leaves(value: Any, path: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, (*path, str(k)))
    else:
        yield path, value


def _is_secret_leaf(path: tuple[str, ...], value: Any) -> bool:
    if value in (None, "", [], {}):
        return False
    if path and is_secret_key(path[-1]):
        return True
    return bool(find_secrets(value))  # URL userinfo, Bearer tokens, --api-key flags


def secret_parameter_paths(overrides: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> list[str]:
    """Dotted paths of credentials in ``overrides`` and the ``data`` tree (see the module docstring)."""
    found: list[str] = []
    for path, value in _leaves(data or {}, ()):
        if _is_secret_leaf(path, value):
            found.append(".".join(path))
    for item in overrides:
        keys, value = parse_override(item)
        for path, leaf in _leaves(value, tuple(keys)):
            if _is_secret_leaf(path, leaf):
                found.append(".".join(path))
    return found


def refuse_secret_parameters(overrides: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> None:
    """Raise ``SecretParameterError`` naming every credential among the parameters."""
    paths = secret_parameter_paths(overrides, data)
    if paths:
        raise SecretParameterError(paths)


def split_secret_overrides(overrides: Iterable[str]) -> tuple[list[str], list[str]]:
    """(public, secret): an override is secret when ``secret_parameter_paths`` finds anything in it."""
    public: list[str] = []
    secret: list[str] = []
    for item in overrides:
        (secret if secret_parameter_paths([item]) else public).append(item)
    return public, secret


def env_secret_overrides(environ: Mapping[str, str] | None = None) -> list[str]:
    """The overrides in ``$ROLLFLOW_SECRET_OVERRIDES`` (a JSON list of strings; unset -> [])."""
    raw = (os.environ if environ is None else environ).get(SECRET_OVERRIDES_ENV, "")
    if not raw.strip():
        return []
    try:
        items = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            SECRET_OVERRIDES_ENV, f"is not JSON ({exc.msg}); expected a list of overrides"
        ) from None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(SECRET_OVERRIDES_ENV, "must be a JSON list of 'section.key=value' strings")
    return items


@contextlib.contextmanager
def secret_overrides_aside(overrides: Iterable[str]) -> Iterator[list[str]]:
    """For a CLI that runs a flow in this process: yield the public overrides (the flow's parameters)
    while ``$ROLLFLOW_SECRET_OVERRIDES`` holds the secret ones; restore the variable afterwards."""
    public, secret = split_secret_overrides(overrides)
    before = os.environ.get(SECRET_OVERRIDES_ENV)
    if secret:
        os.environ[SECRET_OVERRIDES_ENV] = json.dumps([*env_secret_overrides(), *secret])
    try:
        yield public
    finally:
        if before is None:
            os.environ.pop(SECRET_OVERRIDES_ENV, None)
        else:
            os.environ[SECRET_OVERRIDES_ENV] = before


def refuse_secret_overrides_for_other_processes(what: str) -> None:
    """``ConfigError`` when ``$ROLLFLOW_SECRET_OVERRIDES`` is set: ``what`` (e.g. distributed mode's
    deployment runs) runs in other processes, which never see this process's command-line secrets."""
    secret = env_secret_overrides()
    if secret:
        paths = secret_parameter_paths(secret)
        raise ConfigError(
            ", ".join(paths),
            f"given on this command line, but {what} run in other processes and would not see it; put the "
            "credential in the work pool's environment (or a Prefect Secret block exported there) instead",
        )
