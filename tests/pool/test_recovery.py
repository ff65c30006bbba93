"""Recovery from what operators do to catalogs: restore a backup, lose the catalog, rebuild
while training runs.  Nothing published may be lost, and a rebuild never changes what the
catalog already records."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Backend,
    FakeClock,
    assert_loads,
    die_before_publish,
    open_on,
    tiny_rollout,
)
from sqlalchemy.engine import make_url

from archive_manager import ArchiveManager, ArchiveWriter
from archive_manager.catalog import blobs_table
from archive_manager.errors import ArchiveError, ArchiveExistsError, GcAbortedError
from archive_manager.pool.manifest import Manifest


def blob_files(root: Path) -> set[str]:
    return {p.name for p in (root / "blobs").rglob("*") if p.is_file()}


def sqlite_copy(source: Path, target: Path) -> None:
    """Copy a SQLite database with SQLite's online backup API (as ``.backup`` does)."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


class CatalogBackup:
    """A backup of a pool's catalog, restored later over it: SQLite's online backup API for the
    file, ``pg_dump``/``pg_restore`` for a PostgreSQL database (as an operator would)."""

    def __init__(self, backend: Backend, root: Path, url: str | None, where: Path) -> None:
        self.backend, self.root, self.url, self.where = backend, root, url, where

    def _libpq(self) -> str:
        assert self.url is not None
        return make_url(self.url).set(drivername="postgresql").render_as_string(False)

    def take(self) -> None:
        if self.url is None:
            sqlite_copy(self.root / "catalog.db", self.where)
            return
        bindir = self.backend.server.bindir  # type: ignore[union-attr]
        subprocess.run(
            [str(bindir / "pg_dump"), "-Fc", "-f", str(self.where), self._libpq()],
            check=True,
            capture_output=True,
        )

    def restore(self) -> None:
        if self.url is None:
            for path in self.root.glob("catalog.db*"):
                path.unlink()
            sqlite_copy(self.where, self.root / "catalog.db")
            return
        bindir = self.backend.server.bindir  # type: ignore[union-attr]
        subprocess.run(
            [
                str(bindir / "pg_restore"),
                "--clean",
                "--if-exists",
                "--single-transaction",
                "-d",
                self._libpq(),
                str(self.where),
            ],
            check=True,
            capture_output=True,
        )


@pytest.fixture
def backup(tmp_path: Path, backend: Backend) -> CatalogBackup:
    root = tmp_path / "pool"
    return CatalogBackup(backend, root, backend.url(root), tmp_path / "catalog.backup")


def test_a_restored_backup_loses_nothing_saved_after_it(
    backup: CatalogBackup, backend: Backend
) -> None:
    """The reproduction: restore a backup, run GC (default grace) — every archive saved
    after the backup lost its blobs, manifests included, so no rebuild could help."""
    root = backup.root
    with open_on(backend, root) as pool:
        pool.save("before", tiny_rollout(seed=1), rollout_id=1)
    backup.take()
    with open_on(backend, root) as pool:
        pool.save("after-1", tiny_rollout(seed=2), rollout_id=2)
        pool.save("after-2", tiny_rollout(seed=3), rollout_id=3)
        pool.retain("checkpoint:x", "before")
    backup.restore()
    files = blob_files(root)
    with open_on(backend, root) as pool:
        assert {a.name for a in pool.find()} == {"before"}
        for grace in (3600.0, 0.0):
            with pytest.raises(GcAbortedError, match="behind its blobs"):
                pool.gc(grace=grace)
        assert not pool.verify().ok  # the missing archives are damage to report
        assert blob_files(root) == files
        report = pool.rebuild_catalog()
        assert report.archives == ["after-1", "after-2"]
        assert pool.gc(grace=0).blobs == 0
        for name, seed in (("before", 1), ("after-1", 2), ("after-2", 3)):
            assert_loads(pool, name, tiny_rollout(seed=seed))
        assert pool.verify(read_data=True).ok
        # A second rebuild finds nothing to do and changes nothing.
        assert pool.rebuild_catalog().archives == []
        # Save numbers keep rising above every manifest on disk.
        seqs = [
            Manifest.decode(pool.store.get(a.manifest_digest)).save_seq  # type: ignore[arg-type]
            for a in (pool.open_archive(n) for n in ("before", "after-1", "after-2"))
        ]
        pool.save("later", tiny_rollout(seed=4), rollout_id=4)
        later = pool.open_archive("later")
        assert later.manifest_digest is not None and None not in seqs
        numbered = [seq for seq in seqs if seq is not None]
        latest = Manifest.decode(pool.store.get(later.manifest_digest)).save_seq
        assert latest is not None and latest > max(numbered)


def test_a_name_saved_again_after_a_restore_keeps_both_archives(
    backup: CatalogBackup, backend: Backend
) -> None:
    root = backup.root
    open_on(backend, root).close()
    backup.take()
    with open_on(backend, root) as pool:
        pool.save("x", tiny_rollout(seed=1), rollout_id=1)
    backup.restore()
    with open_on(backend, root) as pool:
        pool.save("x", tiny_rollout(seed=2), rollout_id=1)  # the catalog did not know x
        # No IntegrityError, and neither is lost: the one published after the backup comes
        # back under a name of its own.
        report = pool.rebuild_catalog()
        (restored,) = report.archives
        assert restored.startswith("x~restored-") and report.renamed == {restored: "x"}
        pool.gc(grace=0)
        assert_loads(pool, "x", tiny_rollout(seed=2))
        assert_loads(pool, restored, tiny_rollout(seed=1))
        assert pool.rebuild_catalog().archives == []


def lose_catalog(backend: Backend, root: Path) -> str | None:
    """Delete the catalog (the SQLite file, or swap in a new empty database)."""
    if backend.name == "sqlite":
        for path in root.glob("catalog.db*"):
            path.unlink()
        return None
    return backend.new_url()


def test_rebuild_restores_the_published_version_not_a_crashed_attempt(
    tmp_path: Path, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of x killed after its manifest, x saved again and published, the catalog lost:
    the rebuild kept whichever manifest had the lower digest.  Eight names, so that a
    rule that picks by chance fails with near certainty."""
    root, clock = tmp_path / "pool", FakeClock()
    names = [f"x{i}" for i in range(8)]
    with open_on(backend, root, clock=clock, lease_ttl=60) as pool:
        for i, name in enumerate(names):
            die_before_publish(pool, name, tiny_rollout(seed=100 + i), monkeypatch)
        clock.advance(120)  # the crashed saves' leases lapse...
        assert len(pool.gc(grace=3600).rolled_back) == len(names)  # ...their rows roll back
        for i, name in enumerate(names):
            pool.save(name, tiny_rollout(seed=200 + i), rollout_id=i)
    url = lose_catalog(backend, root)
    with ArchiveManager.open(root, catalog_url=url, recover=True, clock=clock) as pool:
        report = pool.rebuild_catalog()
        assert report.archives == sorted(names)
        superseded = [r for r in report.skipped.values() if r.startswith("superseded")]
        assert len(superseded) == len(names)
        for i, name in enumerate(names):
            assert_loads(pool, name, tiny_rollout(seed=200 + i))
        clock.advance(7200)
        pool.gc()
        for i, name in enumerate(names):
            assert_loads(pool, name, tiny_rollout(seed=200 + i))


def test_rebuild_beside_a_save_in_flight_publishes_nothing_of_it(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached, go = threading.Event(), threading.Event()
    real = ArchiveWriter._commit_ownership

    def paused(self: ArchiveWriter) -> Any:
        reached.set()
        assert go.wait(60)
        return real(self)

    monkeypatch.setattr(ArchiveWriter, "_commit_ownership", paused)
    errors: list[BaseException] = []

    def save() -> None:
        try:
            pool.save("inflight", tiny_rollout(seed=9), rollout_id=9)
        except BaseException as exc:
            errors.append(exc)

    saver = threading.Thread(target=save)
    saver.start()
    assert reached.wait(60)
    report = pool.rebuild_catalog()
    assert report.archives == [] and report.blobs == 0
    go.set()
    saver.join(60)
    assert not errors
    assert_loads(pool, "inflight", tiny_rollout(seed=9))
    verify = pool.verify()
    assert verify.ok and not verify.notices


def test_rebuild_beside_a_crashed_save_gc_is_collecting(
    open_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    pool = open_pool(clock=clock, lease_ttl=60)
    die_before_publish(pool, "crashed", tiny_rollout(seed=3), monkeypatch)
    clock.advance(7200)
    pool.gc(dry_run=False)  # rolls it back and reclaims what it wrote
    report = pool.rebuild_catalog()
    assert "crashed" not in report.archives
    assert pool.find(state=None) == []
    assert pool.gc().blobs == 0 and pool.verify().ok


def test_a_file_vanishing_during_rebuild_is_skipped(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    real = pool.store.iter_stat

    def with_a_ghost() -> Any:
        yield from real()
        yield ("0" * 32, 10, time.time())  # listed, then gone

    monkeypatch.setattr(pool.store, "iter_stat", with_a_ghost)
    report = pool.rebuild_catalog()
    assert report.archives == [] and report.blobs == 0
    with pool.catalog.read() as conn:
        assert "0" * 32 not in set(conn.execute(blobs_table.select()).scalars())


@pytest.mark.slow  # a soak of fixed duration (tests/README.md, "slow")
def test_rebuild_gc_and_saves_together_lose_nothing(tmp_path: Path, backend: Backend) -> None:
    """Savers, a GC loop (grace 0) and a rebuild loop on one live pool, for a few seconds."""
    root = tmp_path / "pool"
    url = backend.url(root)
    open_on(backend, root).close()
    stop = time.monotonic() + 6
    saved: dict[str, int] = {}
    errors: list[BaseException] = []

    def saver(prefix: str) -> None:
        with ArchiveManager.open(root, catalog_url=url, chunk_size=2) as pool:
            i = 0
            while time.monotonic() < stop:
                name = f"{prefix}-{i}"
                try:
                    # Same seeds across savers: blobs are shared, so dedup races GC.
                    pool.save(name, tiny_rollout(4, seed=i % 5), rollout_id=i)
                    saved[name] = i % 5
                    if i % 3 == 0:
                        pool.open_archive(name).release()
                        del saved[name]
                except BaseException as exc:
                    errors.append(exc)
                    return
                i += 1

    def looper(what: str) -> None:
        with ArchiveManager.open(root, catalog_url=url) as pool:
            while time.monotonic() < stop:
                try:
                    if what == "gc":
                        pool.gc(grace=0)
                    else:
                        assert pool.rebuild_catalog().archives == []
                except BaseException as exc:
                    errors.append(exc)
                    return

    threads = [
        threading.Thread(target=saver, args=("a",)),
        threading.Thread(target=saver, args=("b",)),
        threading.Thread(target=looper, args=("gc",)),
        threading.Thread(target=looper, args=("rebuild",)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with ArchiveManager.open(root, catalog_url=url) as pool:
        assert len(saved) > 4
        for name, seed in saved.items():
            assert_loads(pool, name, tiny_rollout(4, seed=seed))
        pool.gc(grace=0)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems
        with pytest.raises(ArchiveExistsError):
            pool.save(next(iter(saved)), tiny_rollout(), rollout_id=0)


def _backup_sqlite(root: Path, where: Path) -> None:
    src, dst = sqlite3.connect(root / "catalog.db"), sqlite3.connect(where)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _restore_sqlite(root: Path, where: Path) -> None:
    for path in root.glob("catalog.db*"):
        path.unlink()
    src, dst = sqlite3.connect(where), sqlite3.connect(root / "catalog.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _chunk_files(pool: ArchiveManager, name: str) -> set[str]:
    return {d for d, _, _ in _manifest_of(pool, name).chunks}


def _manifest_of(pool: ArchiveManager, name: str) -> Manifest:
    from archive_manager.pool.manifest import Manifest

    arc = pool.open_archive(name)
    assert arc.manifest_digest is not None
    return Manifest.decode(pool.store.get(arc.manifest_digest), arc.manifest_digest)


@pytest.mark.parametrize("exists", [False, True], ids=["missing-dir", "empty-dir"])
def test_rebuild_catalog_on_a_mistyped_path_creates_nothing(tmp_path: Path, exists: bool) -> None:
    """A tired operator runs `archive-manager --root /data/poool rebuild-catalog --yes` (a
    typo, or an empty folder).  It is refused ("nothing to recover") — and a refused open must
    change nothing on disk.  Instead the folder and an empty, migrated `catalog.db` are left
    behind, after which `ArchiveManager.exists()` says a pool is there and
    `open(create=False)` (meant so that "a mistyped path never makes an empty pool")
    happily opens it."""
    root = tmp_path / "poool"
    if exists:
        root.mkdir()
    with pytest.raises(ArchiveError, match="nothing to recover"):
        ArchiveManager.open(root, recover=True)
    assert not ArchiveManager.exists(root)
    assert (sorted(p.name for p in root.iterdir()) if root.exists() else None) == (
        [] if exists else None
    )


def test_a_name_saved_again_after_a_restore_does_not_lose_the_published_archive(
    tmp_path: Path,
) -> None:
    """The restore drill with a busy training job: the catalog is restored from last night's
    backup and, before anyone runs `rebuild-catalog`, the job saves its next rollout under a
    name the catalog no longer knows (`rollout_7`, saved after the backup and published).  The
    save is accepted; the rebuild then skips the published `rollout_7` ("the catalog already
    has an archive") and indexes its blobs as unowned, so the next GC deletes a published
    archive for good.  "Afterwards nothing is lost" should hold: either the save is refused
    while the catalog is behind its blobs (a manifest of that name has no row), or the
    published archive's blobs stay retained after the rebuild."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("rollout_6", tiny_rollout(seed=6), rollout_id=6)
    _backup_sqlite(root, tmp_path / "catalog.bak")
    with ArchiveManager.open(root) as pool:
        pool.save("rollout_7", tiny_rollout(seed=7), rollout_id=7)
        first_chunks = _chunk_files(pool, "rollout_7")
    _restore_sqlite(root, tmp_path / "catalog.bak")
    with ArchiveManager.open(root) as pool:
        # Refusing this save while the catalog is behind its blobs would be fine too.
        with contextlib.suppress(ArchiveError):
            pool.save("rollout_7", tiny_rollout(seed=70), rollout_id=7)
        pool.rebuild_catalog()
        pool.gc(grace=0)
        gone = [d for d in first_chunks if not pool.store.has(d)]
        assert gone == [], f"GC deleted {len(gone)} chunks of the published rollout_7"


_REBUILD_UNDER_A_FILE_SIZE_LIMIT = """
import os, resource, signal, sys
# No bytecode written under the limit below: a .pyc cut short would be put in place and
# poison the cache every later process imports from.
sys.dont_write_bytecode = True
from archive_manager import ArchiveManager
from archive_manager.errors import ArchiveError

root, when = sys.argv[1], sys.argv[2]


def limit(size):
    # `ulimit -f`: a write past `size` bytes fails with EFBIG (SIGXFSZ would kill instead).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


if when == "open":
    limit(8192)  # below the size of the catalog's empty tables
try:
    pool = ArchiveManager.open(root, recover=True)
    if when == "rebuild":
        files = [os.path.join(root, "catalog.db" + end) for end in ("", "-wal")]
        limit(max(os.path.getsize(f) for f in files if os.path.exists(f)) + 4096)
    pool.rebuild_catalog()
except (ArchiveError, OSError) as exc:
    print("failed:", exc)
else:
    print("rebuilt")
"""


@pytest.mark.parametrize("when", ["open", "rebuild"])
def test_a_rebuild_that_fails_leaves_the_lost_catalog_lost(tmp_path: Path, when: str) -> None:
    """`ulimit -f` (or a full disk) during `rebuild-catalog` of a lost SQLite catalog left a
    partial `catalog.db`, and the pool then read as "no pool here, create one with init"
    instead of "catalog missing, run rebuild-catalog".  A failed rebuild, in its open or
    in the rebuild itself, leaves no catalog file; the next rebuild restores everything."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        for i in range(8):
            pool.save(f"r{i}", tiny_rollout(30, seed=i), rollout_id=i)
    for end in ("", "-wal", "-shm"):
        (root / f"catalog.db{end}").unlink(missing_ok=True)
    run = subprocess.run(
        [sys.executable, "-c", _REBUILD_UNDER_A_FILE_SIZE_LIMIT, str(root), when],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.startswith("failed:"), run.stdout + run.stderr
    assert not [p.name for p in root.iterdir() if p.name.startswith("catalog.db")]
    with pytest.raises(ArchiveError, match=r"is missing.*rebuild-catalog"):
        ArchiveManager.open(root, create=False)
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
        assert {a.name for a in pool.find()} == {f"r{i}" for i in range(8)}
