"""Redaction of credentials in anything logged: by key name, by URL userinfo, by flag and by value.

What it is: pure functions over plain values (str, Mapping, list), stdlib plus the tree limits, used wherever a config
or parameters are written out (MLflow params and the logged YAML through ``rollflow.configuration.loader``):

* **by key**: a mapping entry whose key looks secret (``api_key``, ``secret``, ``token``, ``password``,
  ``authorization``, ``credential``, ``...key``) -> ``"***"``;
* **by URL userinfo**: ``s3://AKIA:s3cr3t@bucket/x`` -> ``s3://***@bucket/x``, in any string, also
  inside longer text; query parameters with secret names (``X-Amz-Signature``, ``token``, ...) too;
* **by scheme**: ``Bearer abc`` -> ``Bearer ***`` wherever it appears;
* **by flag**: in an argument list, the value after ``--api-key`` (or ``--api-key=v``, ``--token``,
  ``--password``, ...) -> ``"***"``;
* **by value**: every secret found by the rules above (and any extra ``known`` secret) is then
  replaced wherever else it appears, e.g. an API key repeated inside ``workflow_kwargs`` or a URL.

``redact_tree(value)`` applies all of them to a nested structure and returns a copy. Because a copy
expands every YAML alias, ``redact_tree`` and ``find_secrets`` first bound the tree's depth and
expansion (``rollflow.configuration.tree_limits``: ``ConfigError`` past them), so an alias bomb in
``workflow_kwargs`` is refused instead of copied into a million leaves.

What it is not: a guarantee. A secret under an innocent key, written without a scheme or flag and
not repeated elsewhere, cannot be recognised; take credentials from the environment or Prefect
Secret blocks, never from parameters. Log-record scrubbing of the S3 client stack is the storage
layer's (it knows the secrets it was given).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from rollflow.configuration.tree_limits import check_tree

__all__ = [
    "REDACTED",
    "find_secrets",
    "is_secret_key",
    "redact_args",
    "redact_text",
    "redact_tree",
    "redact_url",
]

REDACTED = "***"
# Words of a key name (split on _ - . and spaces, lower-cased) that mark its value secret; "key" and
# "token" count only as the last word ("api_key", "X-Api-Key", "hf_token"), so "key_path",
# "stop_token_ids" or "max_tokens" stay visible.
_SECRET_WORDS = frozenset(
    {"secret", "password", "passwd", "pwd", "apikey", "credential", "credentials", "authorization"}
)
_SECRET_LAST_WORDS = frozenset({"key", "token"})
_MIN_SECRET_LEN = 4  # shorter "secrets" (a test's "k") would blank out unrelated text by value

# scheme://userinfo@host...: userinfo up to the first '@' before any '/', '?', '#' or whitespace.
_URL_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
_URL_QUERY_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)\?(?P<query>[^\s#]*)")
# Case-sensitive on purpose: "a basic sum" in a prompt is prose; a Basic credential sits under an
# Authorization key, which the key rule masks.
_AUTH_SCHEME_RE = re.compile(r"\b(?P<scheme>Bearer)\s+(?P<cred>[A-Za-z0-9._~+/=-]+)")
_WORD_SPLIT_RE = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")


def is_secret_key(name: object) -> bool:
    """True when a mapping key or flag name looks like it holds a credential.

    ``api_key``, ``apiKey``, ``X-Api-Key``, ``--api-key``, ``aws_secret_access_key``, ``session_token``,
    ``Authorization``, ``password`` -> True; ``max_tokens``, ``stop_token_ids``, ``tokenizer``,
    ``endpoint_url`` -> False.
    """
    words = [w.lower() for w in _WORD_SPLIT_RE.split(str(name).strip("-")) if w]
    return bool(words) and (any(w in _SECRET_WORDS for w in words) or words[-1] in _SECRET_LAST_WORDS)


def _secret_param(name: str) -> bool:
    return is_secret_key(name) or name.lower().endswith(("signature", "sig"))


def _secret_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(_secret_param(k) for k, _ in pairs):
        return query
    return urlencode([(k, REDACTED if _secret_param(k) else v) for k, v in pairs], safe="*")


def redact_url(url: str) -> str:
    """A URL (or any text holding URLs) without userinfo and secret query values."""
    text = _URL_USERINFO_RE.sub(lambda m: f"{m['scheme']}{REDACTED}@", url)
    return _URL_QUERY_RE.sub(lambda m: f"{m['scheme']}?{_secret_query(m['query'])}", text)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with URL userinfo, ``Bearer`` credentials and every ``known`` secret masked."""
    out = redact_url(text)
    out = _AUTH_SCHEME_RE.sub(lambda m: f"{m['scheme']} {REDACTED}", out)
    for secret in sorted({s for s in known if len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True):
        out = out.replace(secret, REDACTED)
    return out


def redact_args(args: Iterable[str], known: Iterable[str] = ()) -> list[str]:
    """A command-line argument list with the values of secret flags (``--api-key X``) masked."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        arg = str(arg)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if arg.startswith("-") and is_secret_key(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg, known))
    return out


def _collect(value: Any, key: object, found: set[str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _collect(v, k, found)
    elif isinstance(value, (list, tuple)):
        args = [str(v) for v in value]
        for i, flag in enumerate(args):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            name, eq, inline = flag.partition("=")
            if flag.startswith("-") and is_secret_key(name):
                found.add(inline if eq else nxt)
        for v in value:
            _collect(v, None, found)
    elif isinstance(value, str):
        if key is not None and is_secret_key(key):
            found.add(value)
        for m in _URL_USERINFO_RE.finditer(value):
            userinfo = m["userinfo"]
            found.add(userinfo.partition(":")[2] or userinfo)
        found.update(m["cred"] for m in _AUTH_SCHEME_RE.finditer(value))


def find_secrets(value: Any) -> set[str]:
    """Every credential the rules of the module docstring recognise in ``value`` (nested)."""
    check_tree(value, "<redacted value>")
    found: set[str] = set()
    _collect(value, None, found)
    return {s for s in found if len(s) >= _MIN_SECRET_LEN}


def _redact(value: Any, key: object, known: frozenset[str]) -> Any:
    if key is not None and is_secret_key(key) and value not in (None, "", {}, []):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: _redact(v, k, known) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        masked = (
            redact_args([str(v) for v in value], known) if all(isinstance(v, str) for v in value) else None
        )
        if masked is not None:
            return masked
        return [_redact(v, None, known) for v in value]
    if isinstance(value, str):
        return redact_text(value, known)
    return value


def redact_tree(value: Any, known: Iterable[str] = ()) -> Any:
    """A copy of ``value`` (nested dicts/lists/strings) with every recognised secret masked.

    Secrets are first collected from the whole tree (plus ``known``), then masked by key, URL,
    scheme, flag and value everywhere, so a key that appears in one place is hidden in all of them.
    """
    secrets = frozenset(find_secrets(value) | {s for s in known if len(s) >= _MIN_SECRET_LEN})  # checks size
    return _redact(value, None, secrets)
