"""Adversarial review of "operator-proof pools": each test reproduces one way in which an
operator, a hostile user or a busy RL engineer still breaks a claim of the README
("Operator actions", "Backing up and restoring a pool") or docs/architecture.md.  Each test
fails on the code it was written against; its docstring says what should happen instead."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import Backend, assert_loads, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.errors import (
    ArchiveError,
    InvalidInputError,
    InvalidNameError,
    PoolIdentityError,
)


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
    from archive_manager.pool.manifest import Manifest

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


def test_a_shared_pool_mounted_at_another_path_opens_on_postgresql(
    tmp_path: Path, backend: Backend
) -> None:
    """The scale-out deployment (PostgreSQL catalog, blobs on a shared filesystem): machine A
    mounts the blob root at /mnt/pool, machine B (a Kubernetes volume) at /data/pool.  Seen
    from B, the root holds the very identity file the catalog records (same pool id, same
    catalog id) and the path A recorded does not exist there.  B is refused ("two pools must
    not share one catalog") although it is one pool and one catalog; it should open (nothing
    about it is a copy or a second catalog).  Simulated by renaming the folder."""
    if backend.name != "postgresql":
        pytest.skip("a shared pool needs a server catalog")
    machine_a, machine_b = tmp_path / "mnt-pool", tmp_path / "data-pool"
    url = backend.url(machine_a)
    with ArchiveManager.open(machine_a, catalog_url=url) as pool:
        pool.save("a", tiny_rollout(seed=1), rollout_id=1)
    machine_a.rename(machine_b)  # what B sees: the same files, at its own mount point
    with ArchiveManager.open(machine_b, catalog_url=url) as pool:
        assert_loads(pool, "a", tiny_rollout(seed=1))


# --------------------------------------------------------------------------- claim 9


def test_no_fragment_of_an_unencoded_password_reaches_an_error_message(tmp_path: Path) -> None:
    """An operator pastes a password holding '@' without percent-encoding it
    (`postgresql+psycopg://trainer:hunter2@xyzzy@127.0.0.1:1/rl`).  SQLAlchemy takes the
    password to end at the first '@' and the rest (`xyzzy`) for part of the host, so the
    message ("cannot reach the catalog server of ...:***@xyzzy@127.0.0.1:1/rl: failed to
    resolve host 'xyzzy@127.0.0.1'") prints the password's tail twice; so does the CLI.  No
    part of a password may be shown: a URL whose host holds '@' should be treated like an
    unparsable one (not echoed)."""
    url = "postgresql+psycopg://trainer:hunter2@xyzzy@127.0.0.1:1/rl"
    with pytest.raises(ArchiveError) as caught:
        ArchiveManager.open(tmp_path / "pool", catalog_url=url).close()
    assert "xyzzy" not in str(caught.value)


# --------------------------------------------------------------------------- claim 10


@pytest.mark.parametrize(
    "char",
    ["\u034f", "\ufe0f", "\U000e0100", "\u3164", "\u115f", "\u2800"],
    ids=["CGJ", "VS16", "VS17", "hangul-filler", "choseong-filler", "braille-blank"],
)
def test_names_refuse_invisible_default_ignorable_characters(tmp_path: Path, char: str) -> None:
    """A hostile user saves `ckpt-1200` + an invisible character beside the real
    `ckpt-1200`: two archives that look identical in `ls`, the viewer and the terminal, and
    `release` of the one seen may hit the other.  Names refuse zero-width characters, but
    only by category (Cc, Cf, Cs, Zl, Zp): the combining grapheme joiner and variation
    selectors (Mn, zero width, Default_Ignorable_Code_Point) and the Hangul fillers / Braille
    blank (letters and symbols that render as nothing) pass.  Expected: InvalidNameError, as
    for U+200B."""
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("ckpt-1200", tiny_rollout(n=1), rollout_id=1)
        with pytest.raises(InvalidNameError):
            pool.save("ckpt-1200" + char, tiny_rollout(n=1, seed=2), rollout_id=1)


# --------------------------------------------------------------------------- claim 11


def test_a_huge_lease_ttl_is_a_library_error(tmp_path: Path) -> None:
    """`lease_ttl=10**400` (a config value in microseconds read as seconds, say) raises a raw
    `OverflowError: int too large to convert to float` from `ArchiveManager.open`; a library
    error (InvalidInputError, as `gc(grace=...)` gives) is expected."""
    with pytest.raises(InvalidInputError):
        ArchiveManager.open(tmp_path / "pool", lease_ttl=10**400).close()


@pytest.mark.parametrize(
    "ttl", [float("inf"), 1e300, timedelta.max], ids=["inf", "1e300", "timedelta.max"]
)
def test_an_unbounded_lease_ttl_is_refused_or_works_without_a_traceback(
    tmp_path: Path, ttl: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lease_ttl=timedelta.max` (or inf, 1e300) is accepted by `open`, but every save's
    heartbeat thread then dies at once with `OverflowError: timestamp out of range for
    platform time_t` (`Event.wait(ttl / n)`), a raw traceback on stderr of every training
    job.  Expected: refused on open with InvalidInputError (a lease that never expires also
    means a crashed writer leaks forever), or saves that work without a thread dying."""
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    try:
        pool = ArchiveManager.open(tmp_path / "pool", lease_ttl=ttl)  # type: ignore[arg-type]
    except InvalidInputError:
        return
    with pool:
        pool.save("a", tiny_rollout(n=1), rollout_id=1)
    assert died == []
