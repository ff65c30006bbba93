"""The S3 blob store against a real S3-compatible server (`juicefs gateway`, see
`tests/s3server.py`): the shipped contract suite, pools on S3 through `ArchiveManager` with
the catalog on SQLite and on PostgreSQL, bad input and faults (docs/architecture/object-stores.md,
"Blobs on an object store").

Skipped when ``juicefs`` is missing, unless ``ARCHIVE_MANAGER_REQUIRE_S3=1`` (CI), which
makes a missing server a failure.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _ranged as ranged
import botocore.exceptions
import pytest
from _s3 import no_secret, s3_fast, s3_prefix, s3_root, s3_samples
from s3server import S3Server
from sqlalchemy import select

from archive_manager import ArchiveManager
from archive_manager._util.digest import digest_of
from archive_manager.blobs import s3 as s3mod
from archive_manager.blobs.base import IncompleteWrite
from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.catalog import blobs_table
from archive_manager.errors import (
    ArchiveError,
    BlobStoreError,
    IntegrityError,
    InvalidInputError,
    InvalidNameError,
    PoolIdentityError,
    PoolRootMissingError,
    ReadOnlyPoolError,
    TransientBlobStoreError,
)
from archive_manager.testing.blob_store import BlobStoreContract, ReadOnlyStoreContract, flip_bit


class TestS3BlobStore(BlobStoreContract, ReadOnlyStoreContract):
    @pytest.fixture
    def store(self, s3_env: S3Server, bucket: str) -> S3BlobStore:
        return S3BlobStore(bucket, s3_prefix())

    def damage(self, store: Any, digest: str, data: bytes) -> None:
        store._client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=data)

    def leave_incomplete(self, store: Any, digest: str) -> bool:
        """A multipart upload a writer killed mid-upload left."""
        store._client.create_multipart_upload(Bucket=store.bucket, Key=store._key(digest))
        return True

    def medium(self, store: Any) -> Any:
        """The prefix's objects (key, ETag, size, time) and multipart uploads, as the server
        lists them."""
        client = store._client
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=store.bucket, Prefix=store.prefix + "/"
        )
        objects = sorted(
            (o["Key"], o["ETag"], o["Size"], o["LastModified"])
            for page in pages
            for o in page.get("Contents", ())
        )
        uploads = client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix + "/")
        return objects, sorted((u["Key"], u["UploadId"]) for u in uploads.get("Uploads", ()))


# --------------------------------------------------------------------------- pools on S3


def test_save_load_gc_verify(s3_env: S3Server, bucket: str, catalog_url: str) -> None:
    root = s3_root(bucket)
    samples = s3_samples()
    with ArchiveManager.open(root, catalog_url=catalog_url, chunk_size=16) as pool:
        assert str(pool.root) == root
        kept = pool.save("kept", samples, rollout_id=1)
        gone = pool.save("gone", samples[:20], rollout_id=2)
        assert [s.tokens for s in kept.load_samples()] == [s.tokens for s in samples]
        key = kept.keys()[17][0]
        [one] = kept.load_samples(sample_key=key)
        assert one.tokens == samples[17].tokens
        assert gone.release()
        report = pool.gc(grace=0)
        assert report.blobs >= 1
        assert pool.verify(read_data=True).ok
        assert pool.open_archive("kept").load_samples()[5].tokens == samples[5].tokens
    # Another process (here: another open) sees the same pool through its catalog.
    with ArchiveManager.open(root, catalog_url=catalog_url, create=False) as again:
        assert [a.name for a in again.find()] == ["kept"]
        assert again.verify(read_data=True).ok


def test_identity_and_journal_live_in_the_bucket(s3_env: S3Server, bucket: str) -> None:
    root = s3_root(bucket)
    prefix = root.split("/", 3)[3]
    with ArchiveManager.open(root, catalog_url=_sqlite_url()) as pool:
        pool.save("a", s3_samples(4), rollout_id=0)
    keys = _keys(s3_env, bucket, prefix)
    assert f"{prefix}/archive-pool.json" in keys
    assert f"{prefix}/blobs/.archive-pool.json" in keys
    assert any(k.startswith(f"{prefix}/journal/") and k.endswith(".rec") for k in keys)
    assert all(k.startswith(prefix + "/") for k in keys)


def test_a_read_only_open_reads_and_writes_nothing(s3_env: S3Server, bucket: str) -> None:
    root = s3_root(bucket)
    prefix = root.split("/", 3)[3]
    url = _sqlite_url()
    samples = s3_samples(8)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
        pool.save("a", samples, rollout_id=0)
        pool.save("b", samples[:4], rollout_id=1).release()
    client: Any = s3_env.client()
    before = {
        item["Key"]: item["ETag"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", ())
    }
    catalog = Path(url.removeprefix("sqlite:///")).read_bytes()
    with ArchiveManager.open(root, catalog_url=url, read_only=True) as pool:
        assert pool.read_only
        archive = pool.open_archive("a")
        assert [s.tokens for s in archive.load_samples()] == [s.tokens for s in samples]
        [one] = archive.load_samples(sample_key=archive.keys()[5][0])
        assert one.tokens == samples[5].tokens
        assert pool.verify(read_data=True).ok
        for write in (
            lambda: pool.save("c", samples, rollout_id=2),
            lambda: pool.gc(grace=0),
            lambda: pool.open_archive("a").release(),
            lambda: pool.retain("job:x", "a"),
        ):
            with pytest.raises(ReadOnlyPoolError):
                write()
        # The second gate: code that reaches the store or the root directly writes nothing
        # either (the catalog's gate alone let pool.store.put_new upload; review rev20).
        chunk = archive.chunks()[0]["digest"]
        upload = IncompleteWrite(f"blobs/{chunk[:2]}/{chunk[2:4]}/{chunk}#no-such-upload", 0.0)
        pool_root: Any = pool.root  # an S3 pool's root is its S3Root (typed as the folder's Path)
        refusals: list[tuple[str, Callable[[], object]]] = [
            ("write a blob", lambda: pool.store.put(b"x" * 100)),
            ("write blobs", lambda: pool.store.put_many([(b"y" * 100, None)])),
            ("write blobs", lambda: pool.store.put_new([(b"z" * 100, None)])),
            ("delete a blob", lambda: pool.store.delete(chunk)),
            ("delete blobs", lambda: pool.store.delete_many([chunk])),
            ("sweep incomplete writes", lambda: pool.store.sweep_incomplete(time.time())),
            ("remove an incomplete write", lambda: pool.store.remove_incomplete(upload)),
            ("write a pool object", lambda: pool_root.write("journal/x.rec", b"{}")),
            ("delete a pool object", lambda: pool_root.delete("archive-pool.json")),
        ]
        for what, refused in refusals:
            with pytest.raises(ReadOnlyPoolError, match=f"refusing to {what}; nothing"):
                refused()
        assert pool.store.has(chunk)
    after = {
        item["Key"]: item["ETag"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", ())
    }
    assert after == before  # not a claim, journal record, blob or identity written or removed
    assert client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []) == []
    assert Path(url.removeprefix("sqlite:///")).read_bytes() == catalog


def test_a_second_catalog_is_refused(s3_env: S3Server, bucket: str) -> None:
    root = s3_root(bucket)
    with ArchiveManager.open(root, catalog_url=_sqlite_url()) as pool:
        pool.save("a", s3_samples(4), rollout_id=0)
    with pytest.raises(PoolIdentityError, match="belongs to pool"):
        ArchiveManager.open(root, catalog_url=_sqlite_url())


def test_racing_new_catalogs_bind_one(s3_env: S3Server, bucket: str) -> None:
    root = s3_root(bucket)
    outcomes: list[str] = []

    def attempt() -> None:
        try:
            ArchiveManager.open(root, catalog_url=_sqlite_url()).close()
            outcomes.append("bound")
        except PoolIdentityError:
            outcomes.append("refused")

    threads = [threading.Thread(target=attempt) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("bound") == 1, outcomes


def _objects(server: S3Server, bucket: str, prefix: str) -> dict[str, str]:
    """Key -> ETag of every object below ``prefix``."""
    client: Any = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", ())}


def _copy_prefix(server: S3Server, bucket: str, source: str, target: str) -> None:
    """``aws s3 cp --recursive``: every object of ``source`` to ``target``."""
    client: Any = server.client()
    for key in _objects(server, bucket, source):
        new = target + key[len(source) :]
        client.copy_object(Bucket=bucket, Key=new, CopySource={"Bucket": bucket, "Key": key})


def _delete_prefix(server: S3Server, bucket: str, prefix: str) -> None:
    client: Any = server.client()
    for key in _objects(server, bucket, prefix):
        client.delete_object(Bucket=bucket, Key=key)


def test_a_copy_of_a_pool_prefix_is_refused_with_the_originals_catalog(
    s3_env: S3Server, bucket: str, catalog_url: str
) -> None:
    """``aws s3 cp --recursive s3://b/pool s3://b/copy``, then the copy opened with the
    original's catalog.  The copy check asked whether the recorded root exists as a local
    path, which a URL never does, so the copy was taken for the pool seen at another mount
    point, and saves through it published archives whose blobs only the copy had.  Refused,
    writing nothing to either prefix or the catalog; a new catalog recovers the copy as a
    pool of its own."""
    root, copy = s3_root(bucket), s3_root(bucket)
    prefix, copied = root.split("/", 3)[3], copy.split("/", 3)[3]
    samples = s3_samples(8)
    with ArchiveManager.open(root, catalog_url=catalog_url) as pool:
        pool.save("a", samples, rollout_id=0)
    _copy_prefix(s3_env, bucket, prefix, copied)
    before = _objects(s3_env, bucket, prefix), _objects(s3_env, bucket, copied)
    with pytest.raises(PoolIdentityError, match="is a copy of the pool at"):
        ArchiveManager.open(copy, catalog_url=catalog_url)
    assert (_objects(s3_env, bucket, prefix), _objects(s3_env, bucket, copied)) == before
    with ArchiveManager.open(root, catalog_url=catalog_url, create=False) as pool:
        assert pool.catalog.get_pool_info("blob_root") == root
        assert [s.tokens for s in pool.open_archive("a").load_samples()] == [
            s.tokens for s in samples
        ]
        pool.save("b", samples[:4], rollout_id=1)
    with ArchiveManager.open(copy, catalog_url=_sqlite_url(), recover=True) as own:
        assert own.rebuild_catalog().archives == ["a"]
        assert own.verify(read_data=True).ok
    with pytest.raises(PoolIdentityError):  # and never the original's catalog again
        ArchiveManager.open(copy, catalog_url=catalog_url)


def test_a_catalog_only_open_of_another_prefix_is_refused(
    s3_env: S3Server, bucket: str, catalog_url: str
) -> None:
    """``ls``, ``info`` and ``stats`` open catalog-only (no request to the store), and with a
    mistyped prefix they listed the catalog's archives as if that prefix held them.  The
    catalog's recorded root is compared with the one given (still no request): refused in
    one line, and the right prefix answers."""
    from click.testing import CliRunner

    from archive_manager.cli import cli

    root = s3_root(bucket)
    with ArchiveManager.open(root, catalog_url=catalog_url) as pool:
        pool.save("a", s3_samples(4), rollout_id=0)
    typo = f"{root}-typo"
    with pytest.raises(PoolIdentityError, match="records the pool at"):
        ArchiveManager.open(typo, catalog_url=catalog_url, catalog_only=True)
    for verb in (["ls"], ["info"], ["stats"]):
        result = CliRunner().invoke(cli, ["--root", typo, "--catalog-url", catalog_url, *verb])
        assert result.exit_code != 0, (verb, result.output)
        assert "records the pool at" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["--root", root, "--catalog-url", catalog_url, "ls"])
    assert result.exit_code == 0 and "a" in result.output


def test_a_pool_moved_to_another_prefix_while_open_gets_no_write(
    s3_env: S3Server, bucket: str, catalog_url: str
) -> None:
    """``aws s3 mv --recursive`` of the pool's prefix while a job has it open: the job's
    next save wrote its blobs under the old prefix again (objects need no folder) and the
    catalog published them there.  Every write refuses before it writes; the catalog then
    follows the pool to its new prefix, with nothing lost."""
    root, moved = s3_root(bucket), s3_root(bucket)
    prefix, target = root.split("/", 3)[3], moved.split("/", 3)[3]
    samples = s3_samples(8)
    with ArchiveManager.open(root, catalog_url=catalog_url) as pool:
        pool.save("a", samples, rollout_id=0)
        pool.retain("job:keep", "a")
        _copy_prefix(s3_env, bucket, prefix, target)
        _delete_prefix(s3_env, bucket, prefix)
        objects = _objects(s3_env, bucket, target)
        for write in (
            lambda: pool.save("b", samples, rollout_id=1),
            lambda: pool.release_owner("job:keep"),
            lambda: pool.open_archive("a").release(),
            lambda: pool.gc(grace=0),
        ):
            with pytest.raises(ArchiveError, match="is gone"):
                write()
        assert _objects(s3_env, bucket, prefix) == {}
        assert _objects(s3_env, bucket, target) == objects
    with ArchiveManager.open(moved, catalog_url=catalog_url, create=False) as pool:
        assert pool.catalog.get_pool_info("blob_root") == moved
        assert [a.name for a in pool.find()] == ["a"]
        assert "job:keep" in {o.owner for o in pool.owners().owners}
        assert pool.verify(read_data=True).ok


def test_an_empty_prefix_is_not_taken_for_the_pool(
    s3_env: S3Server, bucket: str, catalog_url: str
) -> None:
    """The object-store side of an empty mount point: the pool's prefix holds nothing (it
    was deleted, or this host's endpoint is another store with a bucket of that name).  The
    catalog's pool was bound there anew and saves went where the pool is not.  Refused,
    writing nothing."""
    root = s3_root(bucket)
    prefix = root.split("/", 3)[3]
    with ArchiveManager.open(root, catalog_url=catalog_url) as pool:
        pool.save("a", s3_samples(4), rollout_id=0)
    _delete_prefix(s3_env, bucket, prefix)
    for read_only in (None, True):
        with pytest.raises(PoolRootMissingError, match="looks unmounted"):
            ArchiveManager.open(root, catalog_url=catalog_url, read_only=read_only)
    assert _objects(s3_env, bucket, prefix) == {}


def test_s3_pool_needs_a_catalog_url(s3_env: S3Server, bucket: str) -> None:
    with pytest.raises(InvalidInputError, match="explicit catalog"):
        ArchiveManager.open(s3_root(bucket))
    with pytest.raises(InvalidNameError):
        ArchiveManager.open("s3://Bad_Bucket/x", catalog_url=_sqlite_url())
    with pytest.raises(InvalidNameError):
        ArchiveManager.open(f"s3://{bucket}/a/../b", catalog_url=_sqlite_url())


def test_missing_bucket(s3_env: S3Server) -> None:
    with pytest.raises(BlobStoreError, match="'no-such-bucket' does not exist") as info:
        ArchiveManager.open("s3://no-such-bucket/p", catalog_url=_sqlite_url())
    no_secret(info.value)


def test_wrong_credentials(s3_env: S3Server, bucket: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-xyz")
    with pytest.raises(BlobStoreError, match="access denied") as info:
        ArchiveManager.open(s3_root(bucket), catalog_url=_sqlite_url())
    no_secret(info.value)
    assert "not-the-secret-xyz" not in str(info.value)


def test_refused_connection_is_transient(s3_env: S3Server, bucket: str, monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(TransientBlobStoreError, match=f"127.0.0.1:{port}") as info:
        S3BlobStore(bucket, "p", **s3_fast())
    assert time.monotonic() - started < 10  # bounded
    assert isinstance(info.value, OSError)
    no_secret(info.value)


def test_errors_name_bucket_and_key(s3_env: S3Server, bucket: str) -> None:
    store = S3BlobStore(bucket, s3_prefix(), **s3_fast())
    digest = store.put(b"x" * 100)
    s3_env.pause()
    try:
        with pytest.raises(TransientBlobStoreError) as info:
            store.get(digest)
    finally:
        s3_env.resume()
    assert f"s3://{bucket}/{store.prefix}/blobs/{digest[:2]}/{digest[2:4]}/{digest}" in str(
        info.value
    )
    assert store.get(digest) == b"x" * 100


def test_replaced_object_is_detected(s3_env: S3Server, bucket: str) -> None:
    root = s3_root(bucket)
    samples = s3_samples(16)
    with ArchiveManager.open(root, catalog_url=_sqlite_url(), chunk_size=8) as pool:
        archive = pool.save("a", samples, rollout_id=0)
        store = pool.store
        assert isinstance(store, S3BlobStore)
        chunk = next(d for d, _, _ in store.iter_stat() if d != _manifest_digest(pool))
        data = store.get(chunk)
        store._client.put_object(
            Bucket=store.bucket, Key=store._key(chunk), Body=flip_bit(data, len(data) // 2)
        )
        report = pool.verify(read_data=True)
        assert not report.ok
        assert any(chunk in str(p) for p in report.problems)
        with pytest.raises(IntegrityError, match=chunk):
            archive.load_samples()


def test_a_save_uploads_its_new_blobs_without_a_head(s3_env: S3Server, bucket: str) -> None:
    # The catalog already says which blobs are new (docs/architecture/object-stores.md, "Blobs on an
    # object store"): a HEAD before each PUT was a round trip per blob for nothing.
    samples = s3_samples()
    with ArchiveManager.open(s3_root(bucket), catalog_url=_sqlite_url(), chunk_size=16) as pool:
        sent: list[tuple[str, str]] = []
        events = pool.store._client.meta.events  # type: ignore[attr-defined]
        for op in ("HeadObject", "PutObject"):
            events.register(
                f"before-parameter-build.s3.{op}",
                lambda params, op=op, **_: sent.append((op, params["Key"])),
            )
        pool.save("a", samples, rollout_id=1)
        blob_keys = {key for op, key in sent if op == "PutObject" and "/blobs/" in key}
        assert len(blob_keys) >= 3
        assert not [key for op, key in sent if op == "HeadObject" and key in blob_keys]
        # An orphan of the same content (a crashed save's upload, no catalog row) is put
        # again by the next save, whole.
        first = pool.open_archive("a").chunks()[0]["digest"]
        orphan = pool.store.get(first)
        assert pool.open_archive("a").release()
        pool.gc(grace=0)
        assert not list(pool.store.iter_stat())
        pool.store.put(orphan)
        again = pool.save("b", samples, rollout_id=2)
        assert [s.tokens for s in again.load_samples()] == [s.tokens for s in samples]
        assert pool.store.get(first) == orphan
        assert pool.verify(read_data=True).ok


def test_one_sample_read_range_is_a_ranged_get(s3_env: S3Server, bucket: str) -> None:
    store = S3BlobStore(bucket, s3_prefix())
    data = os.urandom(3 << 20)
    digest = store.put(data)
    sent: list[dict[str, Any]] = []
    real = store._client.get_object

    def spy(**kwargs: Any) -> Any:
        sent.append(kwargs)
        return real(**kwargs)

    store._client.get_object = spy
    assert store.read_range(digest, 1_000_000, 4096) == data[1_000_000:1_004_096]
    assert [k.get("Range") for k in sent] == ["bytes=1000000-1004095"]


def test_multipart_upload_and_abort(s3_env: S3Server, bucket: str, monkeypatch) -> None:
    monkeypatch.setattr(s3mod, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 << 20)
    store = S3BlobStore(bucket, s3_prefix(), **s3_fast())
    big = os.urandom(12 << 20)
    digest = store.put([big[:7], big[7:]])
    assert store.get(digest) == big and store.incomplete_writes() == []
    # A failure mid-upload aborts it: no object, no upload left.
    other = os.urandom(12 << 20)
    real = store._client.upload_part
    calls = []

    def failing(**kwargs: Any) -> Any:
        calls.append(kwargs["PartNumber"])
        if kwargs["PartNumber"] == 2:  # the connection drops on every try of part 2
            raise botocore.exceptions.EndpointConnectionError(endpoint_url=s3_env.endpoint)
        return real(**kwargs)

    store._client.upload_part = failing
    with pytest.raises(TransientBlobStoreError):
        store.put(other)
    store._client.upload_part = real
    assert not store.has(digest_of(other))
    assert store.incomplete_writes() == []
    # An upload left by a killed writer is an incomplete write; the sweep aborts it.
    key = store._key(digest_of(other))
    store._client.create_multipart_upload(Bucket=bucket, Key=key)
    [left] = store.incomplete_writes()
    assert left.name.startswith("blobs/") and store.sweep_incomplete(time.time() - 3600) == 0
    assert store.sweep_incomplete(time.time() + 60) == 1
    assert store.incomplete_writes() == []


def test_server_stopped_mid_save(s3_env: S3Server, bucket: str, tmp_path: Path) -> None:
    root = s3_root(bucket)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    samples = s3_samples(48)
    store = S3BlobStore.from_url(root, **s3_fast())
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8, store=store) as pool:
        pool.save("before", samples[:8], rollout_id=0)
        # `_put` is what `put` and `put_new` (a save's uploads) both run.
        real = store._put
        count = [0]

        def put(data: Any, digest: str | None = None, *, look: bool) -> str:
            count[0] += 1
            if count[0] == 3:
                s3_env.pause()
            return real(data, digest, look=look)

        store._put = put  # type: ignore[method-assign]
        try:
            with pytest.raises(BlobStoreError) as info:
                pool.save("during", samples, rollout_id=1)
        finally:
            s3_env.resume()
            del store._put
        assert bucket in str(info.value)
        names = [a.name for a in pool.find()]
        assert names == ["before"]
        pool.gc(grace=0)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems
        assert len(pool.open_archive("before").load_samples()) == 8
        pool.save("after", samples, rollout_id=2)
        assert pool.verify(read_data=True).ok


def test_server_stopped_with_several_uploads_in_flight(
    s3_env: S3Server, bucket: str, tmp_path: Path
) -> None:
    """The server killed while the two chunks of a pair upload at once, with the next pair
    queued behind them (two stores in flight): the save fails naming the bucket, nothing is
    published, and once the server is back and the lease lapsed a GC leaves no object without
    its row nor a row without its object, and a verify finishes clean."""
    root = s3_root(bucket)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    samples = s3_samples(64)
    store = S3BlobStore.from_url(root, **s3_fast())
    # A short lease: the rollback cannot delete from a dead server, so GC clears what the
    # save left once its lease lapsed.
    with ArchiveManager.open(
        root, catalog_url=url, chunk_size=8, store=store, lease_ttl=2.0
    ) as pool:
        # The last chunk's samples: the first pairs of the next save share no blob with it.
        pool.save("before", samples[-8:], rollout_id=0)
        real = store._put
        count = [0]
        started = threading.Barrier(2, timeout=30)
        killed: list[threading.Thread] = []

        def kill_soon() -> None:
            # Mid-request: both uploads have begun when the server goes.
            killer = threading.Timer(0.005, s3_env.pause)
            killed.append(killer)
            killer.start()

        lock = threading.Lock()

        def put(data: Any, digest: str | None = None, *, look: bool) -> str:
            with lock:
                count[0] += 1
                n = count[0]
            # The second pair's two chunks, uploading side by side: the last to start kills.
            if n in (3, 4) and started.wait() == 0:
                kill_soon()
            return real(data, digest, look=look)

        store._put = put  # type: ignore[method-assign]
        try:
            with pytest.raises(BlobStoreError) as info:
                pool.save("during", samples, rollout_id=1)
        finally:
            for killer in killed:
                killer.join()
            s3_env.resume()
            del store._put
        assert count[0] >= 4
        assert bucket in str(info.value)
        assert [a.name for a in pool.find()] == ["before"]
        time.sleep(2.1)
        pool.gc(grace=0)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems
        assert store.incomplete_writes() == []
        listed = {d for d, _, _ in store.iter_stat()}
        with pool.catalog.read() as conn:
            rows = {r.digest for r in conn.execute(select(blobs_table.c.digest))}
        assert listed == rows  # no orphan left in the bucket, no row without its object
        assert len(pool.open_archive("before").load_samples()) == 8
        pool.save("after", samples, rollout_id=2)
        assert pool.verify(read_data=True).ok


def _rewrite_object(pool: ArchiveManager, digest: str, data: bytes) -> None:
    store = pool.store
    assert isinstance(store, S3BlobStore)
    store._client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=data)


@pytest.fixture
def ranged_pool(s3_env: S3Server, bucket: str) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(
        s3_root(bucket), catalog_url=_sqlite_url(), chunk_size=ranged.CHUNK
    ) as pool:
        yield pool


def test_ranged_load_same_samples(ranged_pool: ArchiveManager, monkeypatch) -> None:
    ranged.check_same_samples(ranged_pool, monkeypatch)


def test_ranged_load_damaged_record(ranged_pool: ArchiveManager, monkeypatch) -> None:
    ranged.check_damaged_record(ranged_pool, _rewrite_object, monkeypatch)


def test_ranged_load_damaged_index_entry(ranged_pool: ArchiveManager, monkeypatch) -> None:
    ranged.check_damaged_index_entry(ranged_pool, _rewrite_object, monkeypatch)


def test_ranged_load_truncated_blob(ranged_pool: ArchiveManager, monkeypatch) -> None:
    ranged.check_truncated(ranged_pool, _rewrite_object, monkeypatch)


def test_ranged_load_version_1_reads_whole(ranged_pool: ArchiveManager, monkeypatch) -> None:
    ranged.check_version_1_reads_whole(ranged_pool, monkeypatch)


_SAVER = """
import os, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
root, url, name = sys.argv[1:4]
with ArchiveManager.open(root, catalog_url=url, chunk_size=8) as pool:
    pool.save(name, make_rollout(32, response_min=32, response_max=96, seed=5), rollout_id=9)
"""


@pytest.mark.parametrize(
    "point",
    [
        "save.blobs.after_commit",
        "save.ownership.after_commit",
        "save.manifest.after_write",
        "save.publish.before_commit",
        "journal.before_write",
    ],
)
def test_crash_matrix_subset(s3_env: S3Server, bucket: str, tmp_path: Path, point: str) -> None:
    """kill -9 a saving process at a failpoint: what was published stays, the dead save is
    wholly visible or wholly invisible, GC and verify finish clean."""
    root = s3_root(bucket)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    samples = s3_samples(16)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8) as pool:
        pool.save("published", samples, rollout_id=0)
    env = {**os.environ, **s3_env.env(), "ARCHIVE_MANAGER_FAILPOINTS": f"{point}=kill"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", _SAVER, root, url, "victim"], env=env, capture_output=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    with ArchiveManager.open(root, catalog_url=url, chunk_size=8, lease_ttl=0.001) as pool:
        time.sleep(0.01)
        pool.gc(grace=0)
        names = sorted(a.name for a in pool.find())
        assert "published" in names
        assert names in (["published"], ["published", "victim"])
        report = pool.verify(read_data=True)
        assert report.ok, report.problems
        loaded = pool.open_archive("published").load_samples()
        assert [s.tokens for s in loaded] == [s.tokens for s in samples]
        if "victim" in names:
            assert len(pool.open_archive("victim").load_samples()) == 32


def test_a_store_passed_to_a_read_only_open_stays_writable(s3_env: S3Server, bucket: str) -> None:
    # The read-only open gates a copy: the caller's configured store is theirs, and may serve
    # a writable pool next.
    root, url = s3_root(bucket), _sqlite_url()
    store = S3BlobStore.from_url(root)
    with ArchiveManager.open(root, catalog_url=url, store=store) as pool:
        pool.save("a", s3_samples(4), rollout_id=0)
    with ArchiveManager.open(root, catalog_url=url, store=store, read_only=True) as pool:
        assert pool.store is not store
        with pytest.raises(ReadOnlyPoolError):
            pool.store.put(b"x" * 100)
        assert len(pool.open_archive("a").load_samples()) == 4
    digest = store.put(b"x" * 100)
    assert store.get(digest) == b"x" * 100
    assert store.delete(digest)
    with ArchiveManager.open(root, catalog_url=url, store=store) as pool:
        assert pool.store is store
        pool.save("b", s3_samples(4), rollout_id=1)
        assert pool.verify(read_data=True).ok


# --------------------------------------------------------------------------- helpers


def _sqlite_url() -> str:
    folder = Path(tempfile.mkdtemp(prefix="am-s3-cat-"))
    # A plain helper, not a fixture: the folder goes when the worker exits, or /tmp fills
    # with one per call (hundreds per suite run).
    atexit.register(shutil.rmtree, folder, True)
    return f"sqlite:///{folder / 'catalog.db'}"


def _keys(server: S3Server, bucket: str, prefix: str) -> list[str]:
    client: Any = server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", ())]


def _manifest_digest(pool: ArchiveManager) -> str:
    digest = pool.open_archive("a").manifest_digest
    assert digest is not None
    return digest
