"""The fault-injecting blob store (`archive_manager.testing.FaultyBlobStore`), and a pool on a
store other than the filesystem's: `ArchiveManager.open(store=...)`, and the error contract
GC relies on (docs/architecture/blob-store-contract.md, "Blob store contract")."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import FakeClock, assert_loads, snapshot_pool, table_rows, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager._util.digest import digest_of
from archive_manager.blobs import BlobStore, MemoryBlobStore
from archive_manager.codec import MANIFEST_MAGIC
from archive_manager.errors import (
    BlobCorruptError,
    BlobStoreError,
    GcAbortedError,
    IntegrityError,
    InvalidInputError,
    TransientBlobStoreError,
)
from archive_manager.testing import FaultyBlobStore

HOUR = 3600.0


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _timeout() -> TransientBlobStoreError:
    return TransientBlobStoreError("the object store timed out")


# --------------------------------------------------------------------------- the wrapper


@pytest.fixture
def faulty() -> FaultyBlobStore:
    return FaultyBlobStore(MemoryBlobStore())


def test_the_nth_put_fails_and_stores_nothing_for_it(faulty: FaultyBlobStore) -> None:
    fault = faulty.fail("put", _enospc, nth=2)
    faulty.put(b"one")
    with pytest.raises(OSError) as info:
        faulty.put(b"two")
    assert info.value.errno == errno.ENOSPC
    assert faulty.put(b"three")  # fired once (times=1)
    assert sorted(faulty.iter_digests()) == sorted(digest_of(d) for d in (b"one", b"three"))
    assert (fault.seen, fault.fired) == (2, 1)  # a spent fault counts no more
    assert faulty.calls["put"] == 3


def test_put_many_stores_the_items_before_the_failing_one(faulty: FaultyBlobStore) -> None:
    faulty.fail("put", _enospc, match=lambda digest, head: head.startswith(b"bad"))
    items = [(b"good 1", None), (b"good 2", None), (b"bad 3", None), (b"good 4", None)]
    with pytest.raises(OSError):
        faulty.put_many(items)
    assert sorted(faulty.iter_digests()) == sorted(digest_of(d) for d, _ in items[:2])


def test_a_fault_for_good_until_cleared(faulty: FaultyBlobStore) -> None:
    digest = faulty.put(b"stays")
    faulty.fail("delete", PermissionError(errno.EACCES, "denied"), times=None)
    for _ in range(3):
        with pytest.raises(PermissionError):
            faulty.delete(digest)
    faulty.clear()
    assert faulty.delete(digest) is True


@pytest.mark.parametrize("op", ["get", "get_view", "open", "check"])
def test_a_corrupted_read_is_a_corrupt_blob_error(faulty: FaultyBlobStore, op: str) -> None:
    digest = faulty.put(b"0123456789")
    faulty.corrupt(times=1)
    with pytest.raises(BlobCorruptError, match=digest):
        getattr(faulty, op)(digest)
    getattr(faulty, op)(digest)  # the next read is clean


def test_unverified_reads_see_the_damage(faulty: FaultyBlobStore) -> None:
    digest = faulty.put(b"0123456789")
    faulty.corrupt()
    assert bytes(faulty.open(digest, verify=False)) == b"1123456789"
    assert faulty.read_range(digest, 0, 2) == b"11"


def test_a_listing_fails_at_once_or_midway(faulty: FaultyBlobStore) -> None:
    for i in range(5):
        faulty.put(b"blob %d" % i)
    faulty.fail("list", _timeout)
    with pytest.raises(TransientBlobStoreError):
        list(faulty.iter_stat())
    faulty.fail("list", _timeout, after=3)
    listed = []
    with pytest.raises(TransientBlobStoreError):
        for item in faulty.iter_digests():
            listed.append(item)
    assert len(listed) == 3
    assert len(list(faulty.iter_digests())) == 5


def test_a_fault_must_name_a_known_operation(faulty: FaultyBlobStore) -> None:
    with pytest.raises(ValueError, match="unknown operation"):
        faulty.fail("write", _enospc)
    with pytest.raises(ValueError):
        faulty.fail("put", _enospc, nth=0)


def test_the_wrapper_shows_the_inner_store(tmp_path: Path) -> None:
    inner = BlobStore(tmp_path / "pool")
    faulty = FaultyBlobStore(inner)
    digest = faulty.put(b"on disk")
    assert faulty.capabilities == inner.capabilities
    assert faulty.path(digest) == inner.path(digest)  # not in the interface: the inner's
    assert faulty.temp_files() == []


# --------------------------------------------------------------------------- pools


@pytest.fixture
def memory_pool(tmp_path: Path, clock: FakeClock) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(
        tmp_path / "pool", store=FaultyBlobStore(MemoryBlobStore()), clock=clock
    ) as pool:
        yield pool


def test_a_pool_on_the_memory_store(memory_pool: ArchiveManager, clock: FakeClock) -> None:
    pool = memory_pool
    samples = tiny_rollout(seed=1)
    pool.save("a", samples, rollout_id=1)
    pool.save("b", tiny_rollout(seed=2), rollout_id=2).release()
    assert_loads(pool, "a", samples)
    assert pool.verify(read_data=True).ok
    clock.advance(HOUR)
    report = pool.gc(grace=0)
    assert report.blobs > 0
    assert_loads(pool, "a", samples)
    assert pool.verify(read_data=True).ok
    # Nothing of the pool's blobs is on disk: the root holds the identity and the catalog.
    assert not any(p.is_file() for p in (pool.root / "blobs").rglob("*") if p.name[0] != ".")


def test_open_refuses_what_is_no_blob_store(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="AbstractBlobStore"):
        ArchiveManager.open(tmp_path / "pool", store=object())  # type: ignore[arg-type]
    assert not (tmp_path / "pool").exists()


@pytest.mark.parametrize("exc", [_enospc, _timeout])
def test_a_failed_put_fails_the_save_and_changes_nothing(
    memory_pool: ArchiveManager, exc: Callable[[], BaseException]
) -> None:
    pool = memory_pool
    store = pool.store
    assert isinstance(store, FaultyBlobStore)
    pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    before = table_rows(pool), sorted(store.inner.iter_digests())
    store.fail("put", exc, match=lambda digest, head: head.startswith(MANIFEST_MAGIC))
    with pytest.raises(OSError):
        pool.save("b", tiny_rollout(seed=2), rollout_id=2)
    assert (table_rows(pool), sorted(store.inner.iter_digests())) == before
    pool.save("b", tiny_rollout(seed=2), rollout_id=2)
    assert_loads(pool, "b", tiny_rollout(seed=2))


def test_a_failed_save_whose_blobs_cannot_be_deleted_still_frees_its_name(
    memory_pool: ArchiveManager, clock: FakeClock
) -> None:
    """The store fails the save's manifest, then every delete (an object store that stopped
    answering): the rollback still drops the lease and the pending archive, so the name is
    free at once (it stayed taken until the lease lapsed: `SaveInFlightError` for a retry by
    the same process), and leaves the blobs, held by nothing, to GC."""
    pool = memory_pool
    store = pool.store
    assert isinstance(store, FaultyBlobStore)
    store.fail("put", _timeout, match=lambda digest, head: head.startswith(MANIFEST_MAGIC))
    store.fail("delete", _timeout, times=None)
    with pytest.raises(TransientBlobStoreError):
        pool.save("b", tiny_rollout(seed=2), rollout_id=2)
    assert pool.owners().saves == [] and pool.find(state=None) == []
    left = sorted(store.inner.iter_digests())
    assert left  # the chunks it wrote
    store.clear()
    pool.save("b", tiny_rollout(seed=2), rollout_id=2)
    pool.open_archive("b").release()
    clock.advance(HOUR)
    pool.gc(grace=0)
    assert sorted(store.inner.iter_digests()) == []
    assert pool.verify(read_data=True).ok


@pytest.mark.parametrize("op", ["list", "incomplete"])
def test_gc_stops_on_a_store_error_while_listing(
    memory_pool: ArchiveManager, clock: FakeClock, op: str
) -> None:
    """An object store's own failure (a BlobStoreError, not the OS's) stops GC before it
    deletes anything, as an OSError of the filesystem does."""
    pool = memory_pool
    store = pool.store
    assert isinstance(store, FaultyBlobStore)
    pool.save("a", tiny_rollout(seed=1), rollout_id=1).release()
    clock.advance(HOUR)
    before = table_rows(pool), sorted(store.inner.iter_digests())
    store.fail(op, _timeout, times=None)
    for dry_run in (True, False):
        with pytest.raises(GcAbortedError, match="timed out"):
            pool.gc(grace=0, dry_run=dry_run)
    assert (table_rows(pool), sorted(store.inner.iter_digests())) == before
    store.clear()
    assert pool.gc(grace=0).blobs > 0


def test_gc_leaves_the_rest_for_the_next_run_on_a_delete_error(
    memory_pool: ArchiveManager, clock: FakeClock
) -> None:
    pool = memory_pool
    store = pool.store
    assert isinstance(store, FaultyBlobStore)
    samples = tiny_rollout(seed=1)
    pool.save("kept", samples, rollout_id=1)
    pool.save("a", tiny_rollout(seed=2), rollout_id=2).release()
    clock.advance(HOUR)
    store.fail("delete", _timeout, nth=2)
    with pytest.raises(GcAbortedError, match="could not unlink"):
        pool.gc(grace=0)
    assert pool.verify(read_data=True).ok
    report = pool.gc(grace=0)
    assert report.finished_from_earlier > 0
    assert_loads(pool, "kept", samples)
    assert pool.verify(read_data=True).notices == []


def test_a_corrupt_read_names_the_blob(memory_pool: ArchiveManager) -> None:
    pool = memory_pool
    store = pool.store
    assert isinstance(store, FaultyBlobStore)
    pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    store.corrupt()
    with pytest.raises(IntegrityError, match="corrupt"):
        pool.open_archive("a").load_samples()
    report = pool.verify(read_data=True)
    assert not report.ok


def test_store_errors_are_os_errors() -> None:
    # GC's and verify's fail-closed handling catch OSError: every store failure must be one.
    assert issubclass(BlobStoreError, OSError)
    assert issubclass(TransientBlobStoreError, BlobStoreError)
    assert issubclass(BlobCorruptError, IntegrityError)


def test_a_local_pool_snapshot_through_the_wrapper(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root, store=FaultyBlobStore(BlobStore(root))) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
        assert snapshot_pool(pool).temp == []
    with ArchiveManager.open(root) as pool:  # the same pool without the wrapper
        assert_loads(pool, "a", tiny_rollout(seed=1))
