"""Faults from the world: a full disk (blob store and catalog), a read-only blob store, a
catalog locked by another process past the busy timeout, a truncated, emptied, garbage or
lost catalog, a catalog from a newer library.

Blob store faults are injected at the store's interface (`FaultyBlobStore`, around the
filesystem store), except the read-only mount, which is injected at the OS.

Each must give a clear error (an `archive_manager.errors` class, or `OSError` where the API
documents it; in the CLI one ``error:`` line and exit 1), never a hang, and leave the pool as
it was: every catalog row, every blob file, no temp file.  A later call works.

Already covered elsewhere, and not repeated here: `BlobStore.put` failing midway, on rename
or when interrupted leaves no temp file (test_blobs.py); `Catalog.open` on a garbage or
truncated file, or at a newer revision or format (test_catalog.py,
test_catalog_migrations.py); a writer whose chunk write failed refuses to go on
(test_save.py); the write lock held past the busy timeout at the `Catalog` level, on
SQLite and PostgreSQL (test_catalog.py, test_catalog_postgresql.py).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import (
    Backend,
    assert_loads,
    blob_files,
    local_store,
    open_on,
    snapshot_pool,
    tiny_rollout,
    wall_clock,
)
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from archive_manager import ArchiveManager
from archive_manager.blobs import BlobStore
from archive_manager.catalog.dialects.postgresql import PG_WRITE_LOCK
from archive_manager.catalog.migrate import VERSION_TABLE
from archive_manager.catalog.models import FORMAT_VERSION
from archive_manager.cli import cli
from archive_manager.codec import MANIFEST_MAGIC, TENSOR_MAGIC
from archive_manager.errors import (
    CatalogError,
    CatalogLockedError,
    CatalogVersionError,
    GcAbortedError,
    PoolIdentityError,
)
from archive_manager.testing import FaultyBlobStore

pytestmark = pytest.mark.timeout(120)

#: Chunks of 8 and tensors above 256 bytes as blobs: a save writes many blobs of each kind.
POOL: dict[str, Any] = {"chunk_size": 8, "inline_limit": 256}


def _cli(root: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--root", str(root), *args], env=env)


def _one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# --------------------------------------------------------------------------- full disk


def _error(err: int) -> Callable[[], OSError]:
    return lambda: OSError(err, os.strerror(err))


#: Which blob put of a save fails (`FaultyBlobStore.fail` options).
FULL_DISK: dict[str, dict[str, Any]] = {
    "first blob": {"nth": 1},
    "fourth blob": {"nth": 4},
    "a tensor blob": {"match": lambda digest, head: head[:8] == TENSOR_MAGIC},
    "the manifest": {"match": lambda digest, head: head[:8] == MANIFEST_MAGIC},
}


def _faults(pool: ArchiveManager) -> FaultyBlobStore:
    assert isinstance(pool.store, FaultyBlobStore)
    return pool.store


@pytest.fixture
def full_pool(tmp_path: Path, backend: Backend) -> Iterator[ArchiveManager]:
    """A pool holding archive "a" (also retained by a checkpoint), on a filesystem store
    wrapped by a `FaultyBlobStore`."""
    root = tmp_path / "pool"
    with open_on(backend, root, store=FaultyBlobStore(BlobStore(root)), **POOL) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)
        pool.retain("checkpoint:1", "a")
        yield pool


def _save(pool: ArchiveManager, how: str, name: str, samples: list) -> None:
    if how == "save":
        pool.save(name, samples, rollout_id=2)
    else:
        with pool.writer(name, rollout_id=2) as writer:
            for sample in samples:
                writer.add(sample)


@pytest.mark.parametrize("how", ["save", "writer"])
@pytest.mark.parametrize("where", list(FULL_DISK))
def test_full_disk_fails_the_save_and_changes_nothing(
    full_pool: ArchiveManager, where: str, how: str
) -> None:
    """ENOSPC while writing a blob: the documented OSError, every row and file as before
    (the lease the save took is dropped, the blobs it wrote are removed, none it shared
    with "a" is touched), no temp file; the same save then succeeds."""
    pool = full_pool
    # The first 8 samples are "a"'s first chunk: shared, so never written again.
    samples = [*tiny_rollout(16, seed=1)[:8], *tiny_rollout(24, seed=2)]
    before = snapshot_pool(pool)
    _faults(pool).fail("put", _error(errno.ENOSPC), **FULL_DISK[where])
    with pytest.raises(OSError) as info:
        _save(pool, how, "b", samples)
    assert info.value.errno == errno.ENOSPC
    assert snapshot_pool(pool) == before
    assert local_store(pool).temp_files() == []
    _faults(pool).clear()
    _save(pool, how, "b", samples)
    assert_loads(pool, "a", tiny_rollout(16, seed=1))
    assert_loads(pool, "b", samples)
    assert pool.verify(read_data=True).ok


def test_failed_fsync_fails_the_save_and_changes_nothing(full_pool: ArchiveManager) -> None:
    """EIO from fsync (a disk that lost the data it accepted): nothing may be published."""
    pool = full_pool
    before = snapshot_pool(pool)

    _faults(pool).fail("put", _error(errno.EIO))
    with pytest.raises(OSError) as info:
        pool.save("b", tiny_rollout(24, seed=3), rollout_id=2)
    assert info.value.errno == errno.EIO
    _faults(pool).clear()
    assert snapshot_pool(pool) == before


def _limit_catalog_growth(pool: ArchiveManager, extra_pages: int) -> Callable[[], None]:
    """Let the SQLite catalog grow by ``extra_pages`` pages at most (SQLITE_FULL past
    that), as a full disk would; return the undo."""
    engine = pool.catalog.engine
    with engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages + extra_pages}")

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # pooled connections predate the limit

    def undo() -> None:
        event.remove(engine, "connect", on_connect)
        engine.dispose()

    return undo


@pytest.mark.parametrize("extra_pages", [0, 4, 40])
def test_full_disk_under_the_catalog(tmp_path: Path, extra_pages: int) -> None:
    """SQLITE_FULL at some point of the save (the lease, the blob rows, the ownership
    commit): a CatalogError saying the disk is full, not SQLAlchemy's OperationalError;
    nothing changed; the save works once there is room."""
    with ArchiveManager.open(tmp_path / "pool", **POOL) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)
        samples = tiny_rollout(200, seed=4)
        before = snapshot_pool(pool)
        undo = _limit_catalog_growth(pool, extra_pages)
        with pytest.raises(CatalogError, match="full"):
            pool.save("b", samples, rollout_id=2)
        assert snapshot_pool(pool) == before
        undo()
        pool.save("b", samples, rollout_id=2)
        assert_loads(pool, "b", samples)
        assert pool.verify().ok


# --------------------------------------------------------------------------- read-only blobs


def _read_only_blob_store(monkeypatch: pytest.MonkeyPatch, root: Path, err: int) -> None:
    """Every file or folder creation and unlink under ``root`` fails with ``err``, as on a
    read-only mount (chmod does not stop root, whom CI runs as)."""
    real_open, real_mkdir, real_unlink = os.open, os.mkdir, os.unlink
    inside = str(root) + os.sep

    def guarded(path: Any, flags: int) -> bool:
        return str(path).startswith(inside) and bool(flags)

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if guarded(path, flags & os.O_CREAT):
            raise OSError(err, os.strerror(err), str(path))
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if guarded(path, 1):
            raise OSError(err, os.strerror(err), str(path))
        real_mkdir(path, *args, **kwargs)

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        # (a missing file is ENOENT even on a read-only mount: the lookup fails first)
        if guarded(path, 1) and os.path.lexists(path):
            raise OSError(err, os.strerror(err), str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "unlink", unlink)


def _check_read_only_store(pool: ArchiveManager, undo: Callable[[], None], code: int) -> None:
    before = snapshot_pool(pool)
    with pytest.raises(OSError) as info:
        pool.save("b", tiny_rollout(24, seed=5), rollout_id=2)
    assert info.value.errno == code
    assert snapshot_pool(pool) == before
    # Reading needs no write: "a" loads, verify rehashes everything.
    assert_loads(pool, "a", tiny_rollout(16, seed=1))
    assert pool.verify(read_data=True).ok
    # GC cannot unlink: it stops, and the next GC (once writable) finishes its work.
    pool.open_archive("a").release()
    pool.release_owner("checkpoint:1")
    with pytest.raises(GcAbortedError, match="could not unlink"):
        pool.gc(grace=0)
    assert pool.verify().ok
    undo()
    pool.gc(grace=0)
    assert blob_files(pool.root) == []
    pool.save("b", tiny_rollout(24, seed=5), rollout_id=2)
    assert pool.verify(read_data=True).ok


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_read_only_blob_store_injected(
    full_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    _read_only_blob_store(monkeypatch, full_pool.root, code)
    _check_read_only_store(full_pool, monkeypatch.undo, code)


@pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root; see the injected test")
def test_read_only_blob_store_by_chmod(full_pool: ArchiveManager) -> None:
    folders = [full_pool.root / "blobs", full_pool.root / "tmp"]
    folders += [p for p in (full_pool.root / "blobs").rglob("*") if p.is_dir()]

    def chmod(mode: int) -> None:
        for folder in folders:
            folder.chmod(mode)

    chmod(0o555)
    try:
        _check_read_only_store(full_pool, lambda: chmod(0o755), errno.EACCES)
    finally:
        chmod(0o755)


# --------------------------------------------------------------------------- locked catalog


_SQLITE_HOLDER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
for line in sys.stdin:
    db.execute("BEGIN EXCLUSIVE" if line.strip() == "lock" else "ROLLBACK")
    print("done", flush=True)
"""


class LockHolder:
    """Another process holding the catalog's write lock: a SQLite connection in a child
    process inside ``BEGIN EXCLUSIVE``, or a PostgreSQL session holding the advisory lock
    every archive_manager writer takes first."""

    def __init__(self, pool: ArchiveManager) -> None:
        url = make_url(pool.catalog_url)
        self.pg: Any = None
        self.child: subprocess.Popen[str] | None = None
        if url.get_backend_name() == "postgresql":
            import psycopg

            dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
            self.pg = psycopg.connect(dsn, autocommit=True)
        else:
            self.child = subprocess.Popen(
                [sys.executable, "-c", _SQLITE_HOLDER, str(url.database)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def _say(self, word: str) -> None:
        assert self.child is not None and self.child.stdin and self.child.stdout
        self.child.stdin.write(word + "\n")
        self.child.stdin.flush()
        assert self.child.stdout.readline().strip() == "done"

    def lock(self) -> None:
        if self.pg is not None:
            self.pg.execute("SELECT pg_advisory_lock(%s)", (PG_WRITE_LOCK,))
        else:
            self._say("lock")

    def unlock(self) -> None:
        if self.pg is not None:
            self.pg.execute("SELECT pg_advisory_unlock(%s)", (PG_WRITE_LOCK,))
        else:
            self._say("unlock")

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
        if self.child is not None:
            self.child.kill()
            self.child.communicate()


@pytest.fixture
def locked_pool(tmp_path: Path, backend: Backend) -> Iterator[tuple[ArchiveManager, LockHolder]]:
    clock = wall_clock()
    with open_on(
        backend, tmp_path / "pool", busy_timeout_ms=300, clock=clock, lease_ttl=60, **POOL
    ) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)
        holder = LockHolder(pool)
        try:
            yield pool, holder
        finally:
            holder.close()


def test_catalog_locked_past_the_busy_timeout(
    locked_pool: tuple[ArchiveManager, LockHolder],
) -> None:
    """Every write gives up after the busy timeout with CatalogLockedError (not a hang);
    reads go on; nothing changed; once the lock is gone, writes work."""
    pool, holder = locked_pool
    before = snapshot_pool(pool)
    holder.lock()
    writes: dict[str, Callable[[], Any]] = {
        "save": lambda: pool.save("b", tiny_rollout(24, seed=6), rollout_id=2),
        "writer": lambda: pool.writer("b", rollout_id=2),
        "retain": lambda: pool.retain("checkpoint:1", "a"),
        "release_owner": lambda: pool.release_owner("checkpoint:1"),
        "release": lambda: pool.open_archive("a").release(),
        "gc": lambda: pool.gc(grace=0),
        "rebuild_catalog": pool.rebuild_catalog,
    }
    for what, call in writes.items():
        started = time.monotonic()
        with pytest.raises(CatalogLockedError, match="busy timeout"):
            call()
        assert time.monotonic() - started < 5, what
    assert [a.name for a in pool.find()] == ["a"]
    assert_loads(pool, "a", tiny_rollout(16, seed=1))
    assert pool.verify(read_data=True).ok
    holder.unlock()
    assert snapshot_pool(pool) == before
    pool.save("b", tiny_rollout(24, seed=6), rollout_id=2)
    assert_loads(pool, "b", tiny_rollout(24, seed=6))


def test_catalog_locked_in_the_middle_of_a_save(
    locked_pool: tuple[ArchiveManager, LockHolder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock appears after the save took its lease and wrote blobs: the save fails with
    CatalogLockedError and cannot even roll back; its lease expires and GC then restores
    the pool exactly as it was."""
    pool, holder = locked_pool
    before = snapshot_pool(pool)
    real_put_new = pool.store.put_new

    def put_new_then_lock(*args: Any, **kwargs: Any) -> list[str]:
        out = real_put_new(*args, **kwargs)
        holder.lock()
        return out

    monkeypatch.setattr(pool.store, "put_new", put_new_then_lock)
    with pytest.raises(CatalogLockedError):
        pool.save("b", tiny_rollout(24, seed=7), rollout_id=2)
    monkeypatch.undo()
    holder.unlock()
    assert pool.verify().ok  # what it left (a lease, blobs) is for GC, not damage
    assert snapshot_pool(pool) != before
    pool.clock.advance(pool.lease_ttl + 1)  # type: ignore[attr-defined]
    pool.gc(grace=0)
    assert snapshot_pool(pool) == before
    assert_loads(pool, "a", tiny_rollout(16, seed=1))


def test_locked_catalog_in_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        holder = LockHolder(pool)
    try:
        holder.lock()
        env = {"ARCHIVE_MANAGER_BUSY_TIMEOUT_MS": "300"}
        started = time.monotonic()
        line = _one_line_error(_cli(root, "retain", "checkpoint:1", "a", env=env))
        assert "locked" in line and "busy timeout (300 ms)" in line
        line = _one_line_error(_cli(root, "gc", "--yes", env=env))
        assert "locked" in line
        assert time.monotonic() - started < 10
        assert _cli(root, "ls", env=env).exit_code == 0  # reads do not wait
    finally:
        holder.close()


# --------------------------------------------------------------------------- damaged catalog


def _closed_pool(root: Path) -> list[str]:
    """A SQLite pool at ``root`` with archive "a", closed (WAL checkpointed); its blobs."""
    with ArchiveManager.open(root, **POOL) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)
    assert not Path(f"{root}/catalog.db-wal").exists()
    return blob_files(root)


def _truncate(db: Path) -> None:
    with db.open("r+b") as f:
        f.truncate(5000)


def _garbage(db: Path) -> None:
    db.write_bytes(b"\x00garbage, not SQLite\n" * 500)


@pytest.mark.parametrize("damage", [_truncate, _garbage], ids=["truncated", "garbage"])
def test_unreadable_catalog_file_is_a_clear_error(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    root = tmp_path / "pool"
    files = _closed_pool(root)
    damage(root / "catalog.db")
    damaged = (root / "catalog.db").read_bytes()
    with pytest.raises(CatalogError, match="truncated or corrupt"):
        ArchiveManager.open(root)
    line = _one_line_error(_cli(root, "info"))
    assert "catalog.db" in line and "rebuild" in line
    assert blob_files(root) == files
    assert (root / "catalog.db").read_bytes() == damaged


@pytest.mark.parametrize("loss", ["emptied", "deleted"])
def test_lost_catalog_never_lets_gc_delete_the_blobs(tmp_path: Path, loss: str) -> None:
    """A catalog emptied to 0 bytes (SQLite takes it for a new database) or deleted: the pool
    opened empty, and GC used to delete every blob as an orphan.  Now the open is refused
    (the blob root belongs to a pool this catalog does not know) unless it is a recovery, and
    GC refuses until the catalog is rebuilt from the manifests; then all is back."""
    root = tmp_path / "pool"
    files = _closed_pool(root)
    db = root / "catalog.db"
    if loss == "emptied":
        db.write_bytes(b"")
    else:
        db.unlink()
    clock = wall_clock()
    clock.advance(7200)  # every blob is past the default grace period
    with pytest.raises(PoolIdentityError, match="rebuild-catalog"):
        ArchiveManager.open(root, clock=clock, **POOL)
    assert _one_line_error(_cli(root, "gc", "--yes")).count("rebuild") >= 1
    assert blob_files(root) == files
    with ArchiveManager.open(root, clock=clock, recover=True, **POOL) as pool:
        assert pool.find(state=None) == []
        for grace in (0, 3600):
            with pytest.raises(GcAbortedError, match="rebuild"):
                pool.gc(grace=grace)
        assert blob_files(root) == files
        assert pool.rebuild_catalog().archives == ["a"]
        pool.gc(grace=0)
        assert blob_files(root) == files
        assert_loads(pool, "a", tiny_rollout(16, seed=1))


def test_new_database_for_an_existing_blob_root_never_lets_gc_delete(
    tmp_path: Path, backend: Backend
) -> None:
    """Pointing a pool's blob root at a fresh catalog (a new PostgreSQL database, a new
    SQLite file elsewhere) is the same loss: GC must not take the blobs for orphans."""
    root = tmp_path / "pool"
    with open_on(backend, root, **POOL) as pool:
        pool.save("a", tiny_rollout(16, seed=1), rollout_id=1)
    files = blob_files(root)
    url = backend.new_url() if backend.name == "postgresql" else f"sqlite:///{tmp_path}/new.db"
    with pytest.raises(PoolIdentityError, match="rebuild-catalog"):
        ArchiveManager.open(root, catalog_url=url, **POOL)
    assert blob_files(root) == files
    with ArchiveManager.open(root, catalog_url=url, recover=True, **POOL) as pool:
        with pytest.raises(GcAbortedError, match="rebuild"):
            pool.gc(grace=0)
        assert blob_files(root) == files
        assert pool.rebuild_catalog().archives == ["a"]
        assert pool.gc(grace=0).orphans == 0
        assert_loads(pool, "a", tiny_rollout(16, seed=1))


@pytest.mark.parametrize("newer", ["revision", "format"])
def test_catalog_of_a_newer_library_is_refused_untouched(
    tmp_path: Path, backend: Backend, newer: str
) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        with pool.catalog.write() as conn:
            if newer == "revision":
                conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099_future'"))
            else:
                conn.execute(
                    text("UPDATE pool_info SET value = :v WHERE key = 'format_version'"),
                    {"v": str(FORMAT_VERSION + 1)},
                )
        files = blob_files(root)
    url = backend.url(root)
    with pytest.raises(CatalogVersionError, match=r"newer|format version") as info:
        ArchiveManager.open(root, catalog_url=url)
    assert "upgrade archive_manager" in str(info.value)
    args = ["--catalog-url", url] if url else []
    assert "upgrade archive_manager" in _one_line_error(_cli(root, *args, "info"))
    assert blob_files(root) == files
    engine_url = url or f"sqlite:///{root / 'catalog.db'}"
    engine = create_engine(engine_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            stamp = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
            fmt = conn.execute(
                text("SELECT value FROM pool_info WHERE key = 'format_version'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert (stamp == "0099_future") == (newer == "revision")
    assert (fmt == str(FORMAT_VERSION + 1)) == (newer == "format")
