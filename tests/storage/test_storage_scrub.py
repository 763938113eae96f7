"""`storage.scrub`: the credential-scrubbing functions `Storage` relies on, checked one by one."""

from __future__ import annotations

import logging

import pytest

from storage.errors import StorageError
from storage.scrub import redact_url, register_secrets, scrub, scrub_exception, scrubbing


def test_redact_url() -> None:
    assert redact_url("http://user:pw@host:9000/p?q=1") == "http://host:9000/p?q=1"
    assert redact_url("http://host/p") == "http://host/p"


def test_scrub_and_scrub_exception() -> None:
    assert scrub("key AKIA123 and s3cr3t", ("AKIA123", "s3cr3t")) == "key *** and ***"
    try:
        try:
            raise OSError("inner AKIA123")
        except OSError as inner:
            raise KeyError("outer") from inner
    except KeyError as e:
        clean = scrub_exception(e, ("AKIA123",))  # the secret is only in the cause: still rebuilt
    assert isinstance(clean, KeyError) and clean.__cause__ is None and "AKIA123" not in repr(clean)
    assert scrub_exception(ValueError("nothing here"), ("AKIA123",)) is None

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"odd AKIA123 {a} {b}")

    assert isinstance(scrub_exception(Odd(1, 2), ("AKIA123",)), StorageError)  # cannot rebuild: StorageError


def test_scrubbing_decorator_and_log_filter(caplog: pytest.LogCaptureFixture) -> None:
    class Holder:
        _secrets = ("tok-SECRET-9",)

        @scrubbing
        def fail(self) -> None:
            raise RuntimeError("denied for tok-SECRET-9")

    with pytest.raises(RuntimeError) as info:
        Holder().fail()
    assert "tok-SECRET-9" not in str(info.value) and info.value.__context__ is None
    lg = logging.getLogger("botocore.endpoint")  # loggers existing at registration get the filter
    register_secrets(("tok-SECRET-9",))
    with caplog.at_level(logging.DEBUG, logger="botocore.endpoint"):
        lg.debug("Authorization: %s", "tok-SECRET-9")
    assert "tok-SECRET-9" not in caplog.text and "***" in caplog.text
