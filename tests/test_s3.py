"""The S3 blob store against a real S3-compatible server (`juicefs gateway`, see
`tests/s3server.py`): the shipped contract suite, pools on S3 through `ArchiveManager` with
the catalog on SQLite and on PostgreSQL, bad input and faults (docs/architecture.md, "Blobs on
an object store").

Skipped when ``juicefs`` is missing, unless ``ARCHIVE_MANAGER_REQUIRE_S3=1`` (CI), which
makes a missing server a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from s3server import S3Server, S3ServerUnavailable

from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.testing.blob_store import BlobStoreContract

REQUIRE_S3_ENV = "ARCHIVE_MANAGER_REQUIRE_S3"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One throwaway S3 server for the session; skips (or fails, in CI) when it cannot run."""
    try:
        import boto3  # noqa: F401
    except ModuleNotFoundError:
        reason = "boto3 is not installed: pip install 'archive_manager[s3]'"
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


def _prefix() -> str:
    return f"t/{uuid.uuid4().hex[:12]}"


def _fast(**kwargs: Any) -> dict[str, Any]:
    """Store options that give up quickly (tests of failures)."""
    return {"attempts": 3, "backoff": 0.02, "max_backoff": 0.1, "connect_timeout": 2.0, **kwargs}


class TestS3BlobStore(BlobStoreContract):
    @pytest.fixture
    def store(self, s3_env: S3Server, bucket: str) -> S3BlobStore:
        return S3BlobStore(bucket, _prefix())

    def damage(self, store: Any, digest: str, data: bytes) -> None:
        store._client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=data)
