"""Credential scrubbing for the storage layer: secrets never reach log lines or exception messages.

What it is: the functions `Storage` uses so that S3 credentials (access key, secret, session token, any
user:password in an endpoint URL) never appear in `repr`, logs or errors:

- `redact_url(url)`: the URL without `user:password@`;
- `scrub(text, secrets)`: `text` with every secret replaced by `***`;
- `scrub_exception(e, secrets)`: a scrubbed copy of `e` if any text in its cause/context chain holds a
  secret, else None;
- `register_secrets(secrets)`: attach a logging filter that scrubs records of the S3 client stack
  (botocore logs request headers at DEBUG, and the Authorization header names the access key id);
- `scrubbing`: a method decorator for classes with a `_secrets` tuple, re-raising scrubbed errors.

What it is NOT: config-level redaction of MLflow params or Prefect parameters (that lives with the
config), and not a secret store. Secrets shorter than 3 characters are not scrubbed (they would match
everywhere); callers filter them out before registering.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from storage.errors import StorageError

_F = TypeVar("_F", bound=Callable[..., Any])
MASK = "***"
FILTERED_PREFIXES = ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "aiohttp")


def redact_url(url: str) -> str:
    """Drop `user:password@` from a URL."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each secret replaced by `***`."""
    for s in secrets:
        text = text.replace(s, MASK)
    return text


def scrub_exception(e: BaseException, secrets: tuple[str, ...]) -> BaseException | None:
    """A copy of `e` (same type where it can be rebuilt from a message, else StorageError) with secrets
    removed, or None if no text in `e`'s cause/context chain holds one.
    """
    if not secrets:
        return None
    texts: list[str] = []
    cur: BaseException | None = e
    while cur is not None and len(texts) < 20:
        texts += [str(cur), repr(cur)]
        cur = cur.__cause__ or cur.__context__
    if not any(s in t for s in secrets for t in texts):
        return None
    msg = scrub(str(e), secrets)
    try:
        return type(e)(msg)
    except Exception:
        return StorageError(msg)


class SecretFilter(logging.Filter):
    """Rewrites log records so that no registered secret appears in them."""

    secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            msg = record.getMessage()
        except Exception:
            return True
        if any(s in msg for s in self.secrets):
            record.msg, record.args = scrub(msg, self.secrets), None
        return True


_SECRET_FILTER = SecretFilter()
_n_loggers_seen = 0


def register_secrets(secrets: tuple[str, ...] = ()) -> None:
    """Remember `secrets`; attach the scrubbing filter to every S3-stack logger created so far.

    Called again before each S3 operation; cheap then, unless new secrets or loggers appeared.
    """
    global _n_loggers_seen
    new = [s for s in secrets if s not in SecretFilter.secrets]
    SecretFilter.secrets.update(new)
    n = len(logging.root.manager.loggerDict)
    if not SecretFilter.secrets or (n == _n_loggers_seen and not new):
        return
    _n_loggers_seen = n
    names = [k for k in list(logging.root.manager.loggerDict) if k.split(".")[0] in FILTERED_PREFIXES]
    for name in names + list(FILTERED_PREFIXES):
        lg = logging.getLogger(name)
        if _SECRET_FILTER not in lg.filters:
            lg.addFilter(_SECRET_FILTER)


def scrubbing(method: _F) -> _F:
    """Re-raise any exception whose text (or chained text) holds one of `self._secrets` as a scrubbed
    copy, raised outside the except block so the secret-bearing original is not chained to it.
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        clean: BaseException | None = None
        secrets: tuple[str, ...] = self._secrets
        if secrets:
            register_secrets(secrets)  # also after unpickling in another process
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            clean = scrub_exception(e, secrets)
            if clean is None:
                raise
        raise clean

    return wrapper  # type: ignore[return-value]
