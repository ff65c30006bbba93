"""Fixtures of the blob stores' tests: the session's S3 server (`juicefs gateway`, see
`tests/s3server.py`), the AWS environment pointing at it, a bucket, and a catalog outside the
bucket. Skipped when the server cannot run, unless ``ARCHIVE_MANAGER_REQUIRE_S3=1`` (CI), which
makes a missing server a failure. The helpers these tests share are in `tests/_s3.py`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3server import S3Server, S3ServerUnavailable

REQUIRE_S3_ENV = "ARCHIVE_MANAGER_REQUIRE_S3"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One throwaway S3 server for the session; skips (or fails, in CI) when it cannot run."""
    try:
        import boto3  # noqa: F401
    except ModuleNotFoundError:
        reason = "boto3 is not installed (the s3 extra)"
        if os.environ.get(REQUIRE_S3_ENV):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        server = S3Server.start()
    except S3ServerUnavailable as exc:
        if os.environ.get(REQUIRE_S3_ENV):
            pytest.fail(f"no S3 server: {exc}")
        pytest.skip(f"no S3 server: {exc}")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The standard AWS environment pointing at the session's server."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def bucket(s3_server: S3Server) -> str:
    return s3_server.create_bucket("archive-pools")


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A catalog outside the bucket: a SQLite file, or a database on the session's server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    server = request.getfixturevalue("pg_server")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)
