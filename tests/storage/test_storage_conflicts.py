"""Exclusive puts: a conflict is decided by the S3 error code, and a retry that meets its own bytes is not one.

The unit tests raise real botocore ClientErrors through s3fs's own translation (the exception chain the
real client produces) from a stub filesystem; the integration tests use moto (and the local backend).
"""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError
from s3fs.errors import translate_boto_error

from storage.errors import CommitConflictError
from storage.fs import Storage, s3_error_code


def _client_error(code: str, status: int, **extra: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "msg", **extra}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


class _StubS3:
    """pipe_file raises `error` (as s3fs would); cat_file returns `existing` (or FileNotFoundError)."""

    def __init__(self, error: BaseException, existing: bytes | None = None) -> None:
        self.error, self.existing = error, existing

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite") -> None:
        raise self.error

    def cat_file(self, path: str) -> bytes:
        if self.existing is None:
            raise FileNotFoundError(path)
        return self.existing


def _stub_storage(error: BaseException, existing: bytes | None = None) -> Storage:
    return Storage(_StubS3(error, existing), "bucket/e/t", "s3://bucket/e/t", is_local=False)  # type: ignore[arg-type]


def test_s3_error_code_walks_the_chain() -> None:
    translated = translate_boto_error(_client_error("ConditionalRequestConflict", 409))
    assert isinstance(translated, OSError) and s3_error_code(translated) == "ConditionalRequestConflict"
    assert s3_error_code(OSError(errno.EIO, "PreconditionFailed: pre-condition failed")) is None  # text only
    assert s3_error_code(ValueError("x")) is None


@pytest.mark.parametrize(
    "error",
    [
        translate_boto_error(_client_error("PreconditionFailed", 412, Condition="If-None-Match")),
        translate_boto_error(_client_error("PreconditionFailed", 412)),  # no Condition: an OSError
        translate_boto_error(_client_error("ConditionalRequestConflict", 409)),
    ],
    ids=["412-if-none-match", "412", "409"],
)
def test_conflict_codes_raise_commit_conflict(error: BaseException) -> None:
    with pytest.raises(CommitConflictError, match="key already exists: c/rec.json"):
        _stub_storage(error, existing=b"theirs").put_bytes("c/rec.json", b"mine", exclusive=True)


def test_error_text_that_looks_like_a_conflict_is_not_one() -> None:
    # A 500 whose message happens to mention the words: it must surface as the error it is.
    err = translate_boto_error(_client_error("InternalError", 500))
    err.args = (errno.EIO, "InternalError: PreconditionFailed / ConditionalRequestConflict / pre-condition")
    with pytest.raises(OSError) as info:
        _stub_storage(err, existing=b"theirs").put_bytes("c/rec.json", b"mine", exclusive=True)
    assert not isinstance(info.value, CommitConflictError)


def test_conflict_with_identical_bytes_is_a_retry_not_a_conflict() -> None:
    err = translate_boto_error(_client_error("PreconditionFailed", 412, Condition="If-None-Match"))
    _stub_storage(err, existing=b"mine").put_bytes("c/rec.json", b"mine", exclusive=True)  # no raise


def test_exclusive_put_same_bytes_succeeds_other_bytes_conflict(storage: Storage) -> None:
    storage.put_bytes("c/rec.json", b"first", exclusive=True)
    storage.put_bytes("c/rec.json", b"first", exclusive=True)  # a retry whose first attempt landed
    with pytest.raises(CommitConflictError):
        storage.put_bytes("c/rec.json", b"second", exclusive=True)
    assert storage.get_bytes("c/rec.json") == b"first"
