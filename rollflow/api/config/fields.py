"""The two helpers every config section uses: ``help_`` (a field's help text, read by the docs generator
and the Prefect form) and ``check`` (a ``ConfigError`` naming the dotted key when a condition fails).

What it is not: a section; no fields live here.
"""

from __future__ import annotations

from typing import Any

from rollflow.api.errors import ConfigError


def help_(text: str, **kw: Any) -> dict[str, Any]:
    """Field metadata: ``{"help": text, **kw}`` (``secret=True``, ``secret_keys=(...)`` mark secrets)."""
    return {"help": text, **kw}


def check(cond: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``cond``."""
    if not cond:
        raise ConfigError(key, message)
