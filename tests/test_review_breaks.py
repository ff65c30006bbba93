"""Adversarial review of "operator-proof pools": each test reproduces one way in which an
operator, a hostile user or a busy RL engineer still breaks a claim of the README
("Operator actions", "Backing up and restoring a pool") or docs/architecture.md.  Each test
fails on the code it was written against; its docstring says what should happen instead."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from conftest import assert_loads, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.errors import ArchiveError, PoolIdentityError


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


def _manifest_of(pool: ArchiveManager, name: str):  # type: ignore[no-untyped-def]
    from archive_manager.manifest import Manifest

    arc = pool.open_archive(name)
    return Manifest.decode(pool.store.get(arc.manifest_digest), arc.manifest_digest)


# --------------------------------------------------------------------------- claim 1


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


def test_rebind_of_a_path_with_no_pool_creates_nothing(tmp_path: Path) -> None:
    """`archive-manager --root COPY rebind` on a path that is not (yet) a copy — the operator
    ran it before the `cp -a` finished creating the folder, or mistyped it — is refused, and
    must leave nothing behind.  It leaves a new `catalog.db` that then passes for a pool."""
    root = tmp_path / "not-a-copy"
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(root, rebind=True)
    assert not root.exists()
    assert not ArchiveManager.exists(root)


def test_a_stale_catalog_stays_refused_after_the_identity_file_is_deleted(
    tmp_path: Path,
) -> None:
    """After `rebuild-catalog` took the root over with a new catalog, the old catalog (found
    again: `catalog.db.bak` moved back, an old PostgreSQL database) must stay refused.  It is
    refused only while `archive-pool.json` exists: an operator who deletes that file (it looks
    like clutter, or a restore of `blobs/` alone) lets the stale catalog bind the root again,
    rewriting the identity file with its own ids — and the catalog that serves the pool now is
    refused."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    stale = tmp_path / "old-catalog.db"
    (root / "catalog.db").rename(stale)
    for extra in root.glob("catalog.db-*"):
        extra.unlink()
    with ArchiveManager.open(root, recover=True) as pool:  # the takeover
        assert pool.rebuild_catalog().archives == ["a"]
        pool.retain("checkpoint:after-takeover", "a")
    (root / "archive-pool.json").unlink()
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(root, catalog_url=f"sqlite:///{stale}").close()
    with ArchiveManager.open(root) as pool:  # the catalog that serves the pool still does
        assert_loads(pool, "a", tiny_rollout(seed=1))


# --------------------------------------------------------------------------- claims 2 and 3


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
