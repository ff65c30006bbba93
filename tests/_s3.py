"""Helpers of the S3 store's tests (tests/blobs/; their fixtures are in tests/blobs/conftest.py)."""

from __future__ import annotations

import uuid
from typing import Any

from s3server import ACCESS_KEY, SECRET_KEY

from archive_manager.interop.synthetic import make_rollout


def s3_prefix() -> str:
    """A prefix no other test uses, so tests share the session's bucket."""
    return f"t/{uuid.uuid4().hex[:12]}"


def s3_root(bucket: str) -> str:
    """A pool root of its own in ``bucket``."""
    return f"s3://{bucket}/{s3_prefix()}"


def s3_samples(n: int = 40) -> list[Any]:
    return make_rollout(n, response_min=32, response_max=96, seed=3)


def s3_fast(**kwargs: Any) -> dict[str, Any]:
    """Store options that give up quickly (tests of failures)."""
    return {"attempts": 3, "backoff": 0.02, "max_backoff": 0.1, "connect_timeout": 2.0, **kwargs}


def no_secret(exc: BaseException) -> None:
    """``exc`` shows no credential and chains no SDK exception for the caller to see."""
    text = f"{exc} {exc!r} {exc.__cause__!r}"
    assert SECRET_KEY not in text
    assert ACCESS_KEY not in text or "AWS_ACCESS_KEY_ID" in text
    assert exc.__cause__ is None
