"""Review rev20: attempts to break `put_new` (a save's uploads without the existence probe,
docs/architecture.md "Blobs on an object store") with real engines: an S3 server
(`tests/s3server.py`), processes killed with SIGKILL, GC racing saves, objects replaced
behind the pool's back, wrappers and third-party stores written before `put_new`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import test_s3
from s3server import S3Server
from test_s3 import _prefix, _samples

from archive_manager import ArchiveManager
from archive_manager.blobs import BlobStore
from archive_manager.blobs.base import PutItem
from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.errors import ReadOnlyPoolError
from archive_manager.testing import FaultyBlobStore

REPO = str(Path(__file__).resolve().parents[1])

# test_s3's fixtures: the session's S3 server, its environment, a bucket.
s3_server = test_s3.s3_server
s3_env = test_s3.s3_env
bucket = test_s3.bucket


def _root(bucket: str) -> str:
    return f"s3://{bucket}/{_prefix()}"


def _tokens(samples: Sequence[Any]) -> list[Any]:
    return [s.tokens for s in samples]


def _env(server: S3Server, **extra: str) -> dict[str, str]:
    return {**os.environ, **server.env(), "PYTHONPATH": REPO, **extra}


# --------------------------------------------------------------------------- old stores


class _LegacyStore(BlobStore):
    """A third-party store written before `put_new`: its put_many takes no ``workers`` (the
    writer used to call ``put_many(items)``), and it counts what it was asked to put."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.seen: list[str] = []

    def put_many(self, items: Sequence[PutItem]) -> list[str]:  # type: ignore[override]
        self.seen.extend(d for _, d in items if d is not None)
        return super().put_many(items)


def test_a_store_whose_put_many_takes_no_workers_still_saves(tmp_path: Path) -> None:
    # Break: put_new's default called put_many(items, workers=4): TypeError in every save.
    store = _LegacyStore(tmp_path)
    samples = _samples(16)
    with ArchiveManager.open(tmp_path, store=store, chunk_size=8) as pool:
        archive = pool.save("a", samples, rollout_id=0)
        assert _tokens(archive.load_samples()) == _tokens(samples)
        assert archive.manifest_digest in store.seen
        assert pool.verify(read_data=True).ok


def test_a_read_only_store_refuses_put_new(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path, chunk_size=8) as pool:
        pool.save("a", _samples(8), rollout_id=0)
    before = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    with ArchiveManager.open(tmp_path, read_only=True) as pool, pytest.raises(ReadOnlyPoolError):
        pool.store.put_new([(b"x" * 100, None)])
    after = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    assert after == before


# --------------------------------------------------------------------------- wrappers on S3


def _count_blob_heads(store: S3BlobStore) -> list[str]:
    heads: list[str] = []
    store._client.meta.events.register(  # type: ignore[attr-defined]
        "before-parameter-build.s3.HeadObject",
        lambda params, **_: heads.append(params["Key"]) if "/blobs/" in params["Key"] else None,
    )
    return heads


def test_a_faulty_wrapper_around_s3_takes_the_put_new_path(s3_env: S3Server, bucket: str) -> None:
    # Break: FaultyBlobStore had no put_new, so the base class's sent put_new to the inner
    # store's put_many: a HEAD per blob, a path a save without the wrapper never takes.  (An
    # S3 pool takes no wrapped store, ArchiveManager.open refuses one; the store is tested.)
    inner = S3BlobStore(bucket, _prefix())
    heads = _count_blob_heads(inner)
    faulty = FaultyBlobStore(inner)
    items = [(os.urandom(1000 + i), None) for i in range(4)]
    digests = faulty.put_new(items, workers=2)
    assert heads == []
    assert faulty.calls["put"] == 4
    assert [inner.get(d) for d in digests] == [data for data, _ in items]
    # A planned put fault still fires on put_new; the items before it were put, whole.
    faulty.fail("put", OSError("injected"), nth=2)
    more = [(os.urandom(500), None), (os.urandom(600), None)]
    with pytest.raises(OSError, match="injected"):
        faulty.put_new(more)
    assert heads == []
    assert inner.get(inner.put(more[0][0])) == more[0][0]


def test_fault_injection_still_sees_a_saves_puts(tmp_path: Path) -> None:
    faulty = FaultyBlobStore(BlobStore(tmp_path))
    with ArchiveManager.open(tmp_path, store=faulty, chunk_size=8) as pool:
        samples = _samples(16)
        archive = pool.save("a", samples, rollout_id=0)
        assert faulty.calls["put"] >= 3  # two chunks and the manifest at least
        faulty.fail("put", OSError("injected"), nth=2)
        with pytest.raises(Exception, match="injected"):
            pool.save("b", _samples(16)[::-1], rollout_id=1)
        assert sorted(a.name for a in pool.find()) == ["a"]
        pool.gc(grace=0)
        assert _tokens(archive.load_samples()) == _tokens(samples)
        assert pool.verify(read_data=True).ok
