"""Credentials never survive into the texts bagpipe keeps or logs."""

from __future__ import annotations

import io
import logging

import pytest

from pipeline.redact import RedactingFilter, protect_logging, redact

SAS = ("https://modiseuwest.blob.core.windows.net/modis-061/MOD10A2/09/05/2022033/x.tif?st=2026-11-23T10%3A00%3A00Z"
       "&se=2026-11-24T11%3A00%3A00Z&sp=rl&sv=2024-05-04&sr=c&skoid=abc&sig=Zm9vYmFyYmF6cXV4%2B%2Fsecret%3D")


@pytest.mark.parametrize(("text", "secret", "kept"), [
    (SAS, "Zm9vYmFyYmF6cXV4", "se=2026-11-24T11%3A00%3A00Z"),
    ("ftp://alice:hunter2@ftp.example.org/MOD10A2/x.hdf: 550", "hunter2", "ftp.example.org/MOD10A2/x.hdf"),
    ("GET https://e4ftl01.cr.usgs.gov/x.hdf?token=eyJhbGciOiJSUzI1NiJ9.payload.sig failed", "eyJhbGciOi",
     "e4ftl01.cr.usgs.gov/x.hdf"),
    ("Authorization: Bearer eyJ0eXAiOiJKV1QiLCJhbGciOi", "eyJ0eXAiOiJKV1Qi", "Authorization"),
    ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqF==;", "Eby8vdM02",
     "AccountName=devstoreaccount1"),
    ("x-functions-key: abcdef0123456789", "abcdef0123456789", "x-functions-key"),
    ("X-Bagpipe-Token: opaque-value-123", "opaque-value-123", "X-Bagpipe-Token"),
    ("refused bgp_0123456789abcdef_" + "s" * 43 + " at login", "s" * 43, "bgp_0123456789abcdef_"),
])
def test_redact_removes_the_secret_and_keeps_what_failed_where(text: str, secret: str, kept: str) -> None:
    clean = redact(text)
    assert secret not in clean
    assert kept in clean
    assert "***" in clean


def test_redact_leaves_texts_without_credentials_alone() -> None:
    text = "https://planetarycomputer.microsoft.com/api/stac/v1/search?collections=modis-10A2-061&limit=100: 503"
    assert redact(text) == text
    assert redact("ftp://anonymous@ftp.example.org/x") == "ftp://anonymous@ftp.example.org/x"


def test_the_logging_filter_redacts_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("bagpipe.test.redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("fetch of %s failed", SAS)
        try:
            raise ConnectionError("ftp://bob:s3cret@host/x")
        except ConnectionError:
            log.exception("feed down")
    finally:
        log.removeHandler(handler)
    written = stream.getvalue()
    assert "Zm9vYmFyYmF6cXV4" not in written and "s3cret" not in written
    assert "fetch of https://modiseuwest.blob.core.windows.net" in written and "ConnectionError" in written


def test_protected_logging_redacts_whatever_handler_writes(capsys: pytest.CaptureFixture[str]) -> None:
    handler = logging.StreamHandler()  # a handler some library added to the root logger
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        protect_logging()
        logging.getLogger("bagpipe.test.protect").warning("GET %s refused", SAS)
    finally:
        root.removeHandler(handler)
    written = capsys.readouterr().err
    assert "refused" in written and "Zm9vYmFyYmF6cXV4" not in written
