"""Opening a storage backend from a root URL: a posix directory or an S3 bucket, with its options.

What it is: ``open_backend`` turns ``(root, experiment, trial, options)`` into an fsspec filesystem,
the trial's base path and its credential-free URI (a ``Backend``), refusing unknown options, S3
options on a local root and credentials in the URL with a ``StorageError`` that says what to pass
instead; ``s3_error_code`` reads the code of an S3 error through s3fs's re-raises; ``ensure_bucket``
creates a bucket. Credentials are registered with ``storage.scrub`` so they never reach a log line.
What it is not: reading or writing keys (``storage.fs.Storage`` does, on the ``Backend`` opened here).
A new backend (another fsspec protocol) is added here and in ``Storage``'s put/list paths.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fsspec

from storage.errors import StorageError
from storage.keys import check_name
from storage.scrub import redact_url, register_secrets
from storage.transfer import DEFAULT_CONCURRENCY

logger = logging.getLogger(__name__)

OPTION_KEYS = frozenset({"endpoint_url", "key", "secret", "token", "region", "fsync", "max_concurrency"})

# S3 error codes of a conditional put that lost: the key exists (412), or a concurrent conditional
# write to the same key is in progress (409). The code, not the message text, decides.
CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})


def s3_error_code(e: BaseException) -> str | None:
    """The S3 error code (`Error.Code` of a botocore ClientError) of `e` or of an exception in its
    cause/context chain (s3fs re-raises ClientErrors as OSErrors with the original as the cause).
    """
    cur: BaseException | None = e
    for _ in range(10):
        if cur is None:
            break
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            if code:
                return str(code)
        cur = cur.__cause__ or cur.__context__
    return None


@dataclass(frozen=True)
class Backend:
    """An opened filesystem and where the trial lives on it (``Storage``'s constructor arguments)."""

    fs: fsspec.AbstractFileSystem
    base: str  # filesystem path of the trial root (no scheme)
    root_uri: str  # trial root URI without credentials
    is_local: bool
    secrets: tuple[str, ...] = ()
    fsync: bool = False
    max_concurrency: int = DEFAULT_CONCURRENCY
    endpoint: str | None = None


def open_backend(root: str, experiment: str, trial: str, options: Mapping[str, Any] | None = None) -> Backend:
    """The backend of ``{root}/{experiment}/{trial}/`` (``Storage.open`` documents root and options)."""
    check_name(experiment, "experiment")
    check_name(trial, "trial")
    opts = dict(options or {})
    unknown = sorted(set(opts) - OPTION_KEYS)
    if unknown:
        raise StorageError(f"unknown storage option(s) {unknown}; allowed: {sorted(OPTION_KEYS)}")
    fsync = bool(opts.pop("fsync", False))
    max_conc = int(opts.pop("max_concurrency", DEFAULT_CONCURRENCY))
    if max_conc < 1:
        raise StorageError("storage option max_concurrency must be >= 1")
    scheme = urlsplit(root).scheme if "://" in root else ""
    if scheme in ("", "file"):
        if any(opts.get(k) for k in ("endpoint_url", "key", "secret", "token")):
            raise StorageError("S3 options (endpoint_url/key/secret/token) given for a local root")
        path = Path(root[len("file://") :] if scheme == "file" else root).expanduser().resolve()
        base = path / experiment / trial
        fs = fsspec.filesystem("file")
        return Backend(fs, str(base), str(base), is_local=True, fsync=fsync, max_concurrency=max_conc)
    if scheme not in ("s3", "s3a"):
        raise StorageError(f"unsupported storage scheme {scheme!r}: use a path, file:// or s3://")
    parts = urlsplit(root)
    if "@" in parts.netloc:
        raise StorageError("credentials in the storage URL are not supported; pass key/secret in options")
    bucket = parts.netloc
    if not bucket:
        raise StorageError("an s3:// root needs a bucket: s3://bucket/prefix")
    prefix = parts.path.strip("/")
    env = os.environ
    endpoint = opts.get("endpoint_url") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    key = opts.get("key") or env.get("AWS_ACCESS_KEY_ID")
    secret = opts.get("secret") or env.get("AWS_SECRET_ACCESS_KEY")
    token = opts.get("token") or env.get("AWS_SESSION_TOKEN")
    region = opts.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    import s3fs  # imported lazily: local-only users need no botocore

    client_kwargs: dict[str, Any] = {}
    if region:
        client_kwargs["region_name"] = region
    fs = s3fs.S3FileSystem(
        key=key,
        secret=secret,
        token=token,
        endpoint_url=endpoint,
        client_kwargs=client_kwargs,
        use_listings_cache=False,
        skip_instance_cache=True,
        max_concurrency=max_conc,
    )
    base = "/".join(p for p in (bucket, prefix, experiment, trial) if p)
    secrets: list[str] = [s for s in (key, secret, token) if s]
    if endpoint:
        ep = urlsplit(endpoint)
        secrets += [s for s in (ep.username, ep.password) if s]
    secrets = [s for s in secrets if len(s) >= 3]
    register_secrets(tuple(secrets))
    return Backend(
        fs,
        base,
        f"s3://{base}",
        is_local=False,
        secrets=tuple(secrets),
        max_concurrency=max_conc,
        endpoint=redact_url(endpoint) if endpoint else None,
    )


def ensure_bucket(fs: fsspec.AbstractFileSystem, base: str) -> None:
    """Create the S3 bucket of ``base`` (``bucket/prefix/...``) on ``fs`` if it does not exist."""
    bucket = base.split("/", 1)[0]
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
        return
    except (FileNotFoundError, PermissionError, OSError):
        pass
    region = (fs.client_kwargs or {}).get("region_name")
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region and region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        fs.call_s3("create_bucket", **kwargs)
    except FileExistsError:
        pass
    except OSError as e:
        if s3_error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    logger.info("created bucket %s", bucket)
