"""Pool identity: a catalog and a blob root are one pool's, or the open is refused.

Each test is an operator's mistake that lost published archives before identities existed:
a second catalog on one blob root, a copied pool, a lost catalog "fixed" by making a new one,
a stale catalog used after the root was taken over, a damaged identity file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from helpers import (
    Backend,
    PoolSnapshot,
    assert_loads,
    extract_legacy,
    open_on,
    snapshot_pool,
    tiny_rollout,
)

from archive_manager import ArchiveManager
from archive_manager.errors import (
    GcAbortedError,
    PoolIdentityError,
    PoolNotFoundError,
    PoolRootMissingError,
)
from archive_manager.pool.identity import IDENTITY_FILE, SPARE_FILE, read_identity

DATA = Path(__file__).parents[1] / "data"


def other_url(backend: Backend, tmp_path: Path) -> str:
    """A second, empty catalog on the same kind of engine."""
    if backend.name == "postgresql":
        return backend.new_url()
    return f"sqlite:///{tmp_path / 'elsewhere' / 'other.db'}"


def blob_count(root: Path) -> int:
    return sum(1 for p in (root / "blobs").rglob("*") if p.is_file() and p.name != SPARE_FILE)


def held(pool: ArchiveManager) -> PoolSnapshot:
    """What ``pool`` holds (`snapshot_pool`), but where its catalog records its root."""
    found = snapshot_pool(pool)
    found.rows["pool_info"] = [r for r in found.rows["pool_info"] if r[0] != "blob_root"]
    return found


def files_of(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder`` but a SQLite catalog's: its content's hash and inode."""
    found = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.name.startswith("catalog.db"):
            found[str(path.relative_to(folder))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                path.stat().st_ino,
            )
    return found


def test_a_new_pool_records_one_identity_on_both_sides(pool: ArchiveManager) -> None:
    found = read_identity(pool.root)
    assert found is not None and pool.identity is not None
    assert found.same_as(pool.identity)
    info = pool.catalog.pool_info()
    assert (info["pool_id"], info["catalog_id"]) == (found.pool_id, found.catalog_id)
    assert json.loads((pool.root / IDENTITY_FILE).read_text())["pool_id"] == found.pool_id


def test_a_second_catalog_is_refused_and_deletes_nothing(tmp_path: Path, backend: Backend) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as first:
        first.save("a", tiny_rollout(), rollout_id=1)
        files = blob_count(root)
    url = other_url(backend, tmp_path)
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    with pytest.raises(PoolIdentityError) as err:
        ArchiveManager.open(root, catalog_url=url)
    message = str(err.value)
    assert str(root) in message and "catalog" in message
    assert blob_count(root) == files
    with open_on(backend, root) as first:
        assert first.gc(grace=0).blobs == 0
        assert_loads(first, "a", tiny_rollout())


def test_a_second_catalog_is_refused_even_on_an_empty_root(
    tmp_path: Path, backend: Backend
) -> None:
    # Before identities, an empty root accepted any catalog, and each catalog's GC then
    # deleted the other's blobs as orphans.
    root = tmp_path / "pool"
    open_on(backend, root).close()
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(root, catalog_url=other_url(backend, tmp_path))


def _race_open(root: Path, url: str, start: threading.Barrier, out: list[object]) -> None:
    start.wait()
    try:
        ArchiveManager.open(root, catalog_url=url).close()
        out.append(url)
    except PoolIdentityError as exc:
        out.append(exc)


def test_two_catalogs_racing_for_an_empty_root_one_wins(tmp_path: Path) -> None:
    for round_ in range(6):
        root = tmp_path / f"pool-{round_}"
        root.mkdir()
        urls = [f"sqlite:///{tmp_path / f'cat-{round_}-{i}.db'}" for i in range(2)]
        results: list[object] = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=_race_open, args=(root, url, start, results)) for url in urls
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [r for r in results if isinstance(r, str)]
        assert len(winners) == 1 and len(results) == 2, results
        found = read_identity(root)
        assert found is not None and found.catalog == winners[0]


def test_many_openers_of_one_new_pool_agree(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    errors: list[BaseException] = []
    ids: list[str] = []
    start = threading.Barrier(4)

    def opener() -> None:
        start.wait()
        try:
            with ArchiveManager.open(root) as pool:
                assert pool.identity is not None
                ids.append(pool.identity.pool_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(ids)) == 1


def test_a_lost_identity_file_is_written_again(pool: ArchiveManager, backend: Backend) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    before = read_identity(pool.root)
    (pool.root / IDENTITY_FILE).unlink()
    with open_on(backend, pool.root) as again:
        assert before is not None and before.same_as(read_identity(again.root))


def test_a_damaged_identity_file_is_refused(pool: ArchiveManager, backend: Backend) -> None:
    (pool.root / IDENTITY_FILE).chmod(0o644)
    (pool.root / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(PoolIdentityError, match="damaged"):
        open_on(backend, pool.root)


def test_an_identity_file_that_is_a_fifo_does_not_hang(
    pool: ArchiveManager, backend: Backend
) -> None:
    path = pool.root / IDENTITY_FILE
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(PoolIdentityError):
        open_on(backend, pool.root)


def test_gc_stops_if_the_root_was_taken_over_while_open(
    pool: ArchiveManager, backend: Backend
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    pool.open_archive("a").release()
    path = pool.root / IDENTITY_FILE
    content = json.loads(path.read_text())
    content["catalog_id"] = "0" * 32
    path.write_text(json.dumps(content))
    files = blob_count(pool.root)
    with pytest.raises(GcAbortedError, match="identity"):
        pool.gc(grace=0)
    assert blob_count(pool.root) == files


# --------------------------------------------------------------------------- lost catalog


def test_a_lost_catalog_is_recovered_only_on_request(tmp_path: Path, backend: Backend) -> None:
    root = tmp_path / "pool"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    files = blob_count(root)
    if backend.name == "sqlite":
        (root / "catalog.db").unlink()
        lost_url = None
        with pytest.raises(PoolIdentityError, match="rebuild-catalog"):
            ArchiveManager.open(root)
        assert not (root / "catalog.db").exists()  # the refused open created nothing
    else:
        lost_url = backend.new_url()  # the old database is gone; a new empty one
        with pytest.raises(PoolIdentityError, match="rebuild-catalog"):
            ArchiveManager.open(root, catalog_url=lost_url)
    with ArchiveManager.open(root, catalog_url=lost_url, recover=True) as pool:
        with pytest.raises(GcAbortedError, match="rebuild"):
            pool.gc(grace=0)
        assert blob_count(root) == files
        report = pool.rebuild_catalog()
        assert report.archives == ["a"]
        assert pool.gc(grace=0).blobs == 0
        assert_loads(pool, "a", tiny_rollout())
    with ArchiveManager.open(root, catalog_url=lost_url) as pool:
        assert_loads(pool, "a", tiny_rollout())


def test_a_stale_catalog_is_refused_after_the_root_was_taken_over(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    shutil.move(root / "catalog.db", tmp_path / "aside.db")  # "lost"
    with ArchiveManager.open(root, recover=True) as pool:
        pool.rebuild_catalog()
    with pytest.raises(PoolIdentityError, match="re-bound"):
        ArchiveManager.open(root, catalog_url=f"sqlite:///{tmp_path / 'aside.db'}")


def test_recover_refuses_a_folder_with_nothing_to_recover(tmp_path: Path) -> None:
    with pytest.raises(PoolNotFoundError, match="nothing to recover"):
        ArchiveManager.open(tmp_path / "empty", recover=True)


def test_recover_refuses_a_catalog_that_has_archives_of_another_pool(tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "one") as one:
        one.save("a", tiny_rollout(), rollout_id=1)
    with ArchiveManager.open(tmp_path / "two") as two:
        two.save("b", tiny_rollout(), rollout_id=1)
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(
            tmp_path / "one",
            catalog_url=f"sqlite:///{tmp_path / 'two' / 'catalog.db'}",
            recover=True,
        )


# --------------------------------------------------------------------------- copies


def test_a_copied_pool_is_refused_until_rebound(tmp_path: Path) -> None:
    root, copy = tmp_path / "pool", tmp_path / "copy"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        original = pool.identity
    shutil.copytree(root, copy, symlinks=True)
    with pytest.raises(PoolIdentityError, match="rebind"):
        ArchiveManager.open(copy)
    with ArchiveManager.open(copy, rebind=True) as pool:
        assert pool.identity is not None and original is not None
        assert pool.identity.pool_id != original.pool_id
        pool.save("only-in-copy", tiny_rollout(seed=3), rollout_id=2)
        pool.open_archive("a").release()
        pool.gc(grace=0)
    with ArchiveManager.open(copy) as pool:
        assert_loads(pool, "only-in-copy", tiny_rollout(seed=3))
    with ArchiveManager.open(root) as pool:
        assert pool.identity is not None and pool.identity.same_as(original)
        assert_loads(pool, "a", tiny_rollout())
        assert pool.gc(grace=0).blobs == 0


def test_a_copy_cannot_take_the_originals_database(tmp_path: Path, backend: Backend) -> None:
    if backend.name != "postgresql":
        pytest.skip("an external catalog only")
    root, copy = tmp_path / "pool", tmp_path / "copy"
    url = backend.url(root)
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    shutil.copytree(root, copy)
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(copy, catalog_url=url)
    with pytest.raises(PoolIdentityError, match="still serves"):
        ArchiveManager.open(copy, catalog_url=url, rebind=True)
    with open_on(backend, root) as pool:
        assert_loads(pool, "a", tiny_rollout())


def test_a_copy_with_a_copy_of_the_database_can_be_rebound(
    tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "postgresql":
        pytest.skip("an external catalog only")
    from sqlalchemy.engine import make_url

    root, copy = tmp_path / "pool", tmp_path / "copy"
    with open_on(backend, root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
    shutil.copytree(root, copy)
    pool_url = backend.url(root)
    assert pool_url is not None
    source = make_url(pool_url).database
    assert backend.server is not None and source is not None
    copy_url = backend.server.create_database(template=source)  # "pg_dump | psql newdb"
    with ArchiveManager.open(copy, catalog_url=copy_url, rebind=True) as pool:
        pool.open_archive("a").release()
        pool.gc(grace=0)
    with open_on(backend, root) as pool:  # the original and its database are untouched
        assert_loads(pool, "a", tiny_rollout())
        assert pool.verify(read_data=True).ok
    backend.server.drop_database(copy_url)


def test_a_moved_pool_is_followed(tmp_path: Path) -> None:
    root, moved = tmp_path / "pool", tmp_path / "moved"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        ident = pool.identity
    root.rename(moved)
    with ArchiveManager.open(moved) as pool:
        assert pool.identity is not None and pool.identity.same_as(ident)
        assert_loads(pool, "a", tiny_rollout())


@pytest.mark.parametrize("how", ["moved", "unmounted"])
def test_a_pool_gone_while_open_gets_no_write(tmp_path: Path, backend: Backend, how: str) -> None:
    """``mv pool pool-old`` (or its mount going away, which leaves the empty mount point at the
    path) while a job has the pool open.  The job's next save made the old path again
    (folders, identity, even the root), wrote its blobs there, and the catalog, which moved
    with the pool, published an archive whose blobs were elsewhere; the moved pool was then
    refused as a copy.  Every write refuses before it writes, and the pool opens where it
    went with nothing lost."""
    root, away = tmp_path / "pool", tmp_path / "pool-old"
    url = backend.url(root)
    samples = tiny_rollout()
    with open_on(backend, root) as pool:
        pool.save("a", samples, rollout_id=1)
        pool.retain("job:keep", "a")
        pool.save("b", tiny_rollout(seed=2), rollout_id=2).release()
        before = held(pool)
        root.rename(away)
        if how == "unmounted":
            root.mkdir()
        moved = files_of(away)
        for write in (
            lambda: pool.save("c", tiny_rollout(seed=3), rollout_id=3),
            lambda: pool.retain("job:x", "a"),
            lambda: pool.open_archive("a").release(),
            lambda: pool.release_owner("job:keep"),
            lambda: pool.gc(grace=0),
        ):
            with pytest.raises((PoolRootMissingError, GcAbortedError), match="gone"):
                write()
        assert files_of(away) == moved
        if how == "moved":
            assert not root.exists()
        else:
            assert list(root.iterdir()) == []
            root.rmdir()
    with ArchiveManager.open(away, catalog_url=url) as pool:
        assert held(pool) == before
        assert_loads(pool, "a", samples)
        pool.save("c", tiny_rollout(seed=3), rollout_id=3)
        assert pool.verify(read_data=True).ok


def test_the_store_never_makes_a_root_it_saw_again(tmp_path: Path) -> None:
    """The second line: a store that is handed blobs after its root went away (a save in
    flight when the pool moved) writes nothing outside the pool, whatever its caller
    checked before."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        root.rename(tmp_path / "away")
        with pytest.raises(PoolRootMissingError, match="not made again"):
            pool.store.put(b"a blob with nowhere to go")
        assert not root.exists()
        root.mkdir()  # the empty mount point: blobs/ and tmp/ went with the mount
        with pytest.raises(PoolRootMissingError, match="not made again"):
            pool.store.put(b"a blob with nowhere to go")
        assert list(root.iterdir()) == []


def test_an_empty_mount_point_is_not_taken_for_the_pool(tmp_path: Path, backend: Backend) -> None:
    """A catalog outside the blob root (PostgreSQL, or a SQLite file elsewhere) and the root
    on a shared mount: on a host whose mount failed the root is an empty folder.  It was
    taken for the pool (an empty root counted as indexing every blob), saves went to the
    local disk, and when the mount returned their archives had no blobs.  Refused, writing
    nothing, for a writer and a reader alike; the pool opens once the mount is back."""
    root, mount = tmp_path / "mnt" / "pool", tmp_path / "the-mount"
    url = backend.url(root) or f"sqlite:///{tmp_path / 'catalog.db'}"
    samples = tiny_rollout()
    with ArchiveManager.open(root, catalog_url=url) as pool:
        pool.save("a", samples, rollout_id=1)
        before = snapshot_pool(pool)
    root.rename(mount)
    root.mkdir()  # the mount point, with nothing mounted on it
    for read_only in (None, True):
        with pytest.raises(PoolRootMissingError, match="looks unmounted"):
            ArchiveManager.open(root, catalog_url=url, read_only=read_only)
        assert list(root.iterdir()) == []
    root.rmdir()
    with pytest.raises(PoolIdentityError):  # a root that is not there at all is not made
        ArchiveManager.open(root, catalog_url=url)
    assert not root.exists()
    mount.rename(root)  # the mount is back
    with ArchiveManager.open(root, catalog_url=url) as pool:
        assert snapshot_pool(pool) == before
        assert_loads(pool, "a", samples)


def test_rebind_of_a_hard_linked_copy_leaves_the_original_alone(
    tmp_path: Path, backend: Backend
) -> None:
    """``cp -al pool copy`` (rsnapshot, ``rsync --link-dest``): every file of the copy is the
    original's inode.  The rebind the library advises rewrote the original's ``catalog.db``
    through the copy's name, and the original then refused to open.  The rebind gives the
    copy files of its own before it writes, and the original keeps every byte and inode."""
    root, copy = tmp_path / "pool", tmp_path / "copy"
    samples = tiny_rollout()
    with open_on(backend, root) as pool:
        pool.save("a", samples, rollout_id=1)
        before = snapshot_pool(pool)
        original = pool.identity
    subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
    files = files_of(root)
    url = None
    if backend.name == "postgresql":  # the database is copied apart ("pg_dump | psql newdb")
        from sqlalchemy.engine import make_url

        pool_url = backend.url(root)
        assert pool_url is not None
        source = make_url(pool_url).database

        assert backend.server is not None and source is not None
        url = backend.server.create_database(template=source)
    else:
        assert (copy / "catalog.db").stat().st_nlink == 2
    with ArchiveManager.open(copy, catalog_url=url, rebind=True) as pool:
        assert pool.identity is not None and original is not None
        assert pool.identity.pool_id != original.pool_id
        pool.save("only-in-copy", tiny_rollout(seed=3), rollout_id=2)
        pool.open_archive("a").release()
        pool.gc(grace=0)
    assert files_of(root) == files
    with open_on(backend, root) as pool:
        assert pool.identity is not None and pool.identity.same_as(original)
        assert snapshot_pool(pool) == before
        assert_loads(pool, "a", samples)
    with ArchiveManager.open(copy, catalog_url=url) as pool:
        assert_loads(pool, "only-in-copy", tiny_rollout(seed=3))
    if url is not None:
        assert backend.server is not None
        backend.server.drop_database(url)


def _every_byte(folder: Path) -> dict[str, str]:
    """Every file under ``folder``, its catalog included: its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize("recorded", ["the original", "absent"])
def test_a_refused_open_of_a_hard_linked_copy_writes_nothing(tmp_path: Path, recorded: str) -> None:
    """``cp -al`` of a pool whose catalog is at an older revision: the copy's open migrated
    the catalog (the original's inode) before its identity check refused it, with a
    ``-wal``/``-shm`` of its own beside a database the original may be writing.  Where the
    recorded path is gone (the fixture as shipped), the copy was taken for the pool moved and
    wrote its own path into the shared catalog.  Refused before any write, the original left
    byte for byte as it was."""
    import sqlite3
    import tarfile

    with tarfile.open(DATA / "pool-r5.tar.gz") as tar:  # revision 0005: an open migrates it
        tar.extractall(tmp_path, filter="data")
    root, copy = tmp_path / "pool-r5", tmp_path / "snapshot"
    if recorded == "the original":
        db = sqlite3.connect(root / "catalog.db")
        with db:
            db.execute("UPDATE pool_info SET value = ? WHERE key = 'blob_root'", (str(root),))
        db.close()
    subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
    before = _every_byte(root)
    match = "is a copy of the pool" if recorded == "the original" else "hard link"
    with pytest.raises(PoolIdentityError, match=match):
        ArchiveManager.open(copy)
    assert _every_byte(root) == before
    assert sorted(p.name for p in copy.glob("catalog.db*")) == ["catalog.db"]
    if recorded == "the original":
        with ArchiveManager.open(root) as pool:  # the original opens (and migrates) as ever
            assert pool.identity is not None


@pytest.mark.parametrize("backend_kind", ["own catalog", "external catalog"])
def test_a_pool_moved_away_from_an_empty_mount_point_is_followed(
    tmp_path: Path, backend: Backend, backend_kind: str
) -> None:
    """A pool moved to a new disk, its old path left as an empty folder (the old mount
    point, or made again): it was called a copy ("run rebind", which would give the real
    pool a new identity) or, with an external catalog, "two pools must not share one
    catalog".  The recorded folder is looked into: empty is moved, and the moved pool opens;
    the empty old path still looks unmounted."""
    if backend_kind == "own catalog" and backend.name == "postgresql":
        pytest.skip("a SQLite catalog inside the pool")
    root, moved = tmp_path / "pool", tmp_path / "new-disk"
    url = backend.url(root) if backend_kind == "external catalog" else None
    if backend_kind == "external catalog" and url is None:
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
    samples = tiny_rollout()
    with ArchiveManager.open(root, catalog_url=url) as pool:
        pool.save("a", samples, rollout_id=1)
        ident = pool.identity
    root.rename(moved)
    root.mkdir()  # the old mount point, left empty
    with ArchiveManager.open(moved, catalog_url=url) as pool:
        assert pool.identity is not None and pool.identity.same_as(ident)
        assert_loads(pool, "a", samples)
        pool.save("b", tiny_rollout(seed=2), rollout_id=2)
    if url is not None:
        with pytest.raises(PoolRootMissingError, match="looks unmounted"):
            ArchiveManager.open(root, catalog_url=url)
        assert list(root.iterdir()) == []


@pytest.mark.parametrize("point", ["identity.rebind.before_commit", "identity.rebind.after_commit"])
def test_a_rebind_of_a_hard_linked_copy_killed_midway_leaves_the_original_alone(
    tmp_path: Path, point: str
) -> None:
    """A rebind of a ``cp -al`` copy SIGKILLed before or after its commit: the original keeps
    every byte, and the operator's second rebind finishes the copy."""
    import sys

    from archive_manager._util import failpoints

    root, copy = tmp_path / "pool", tmp_path / "copy"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        original = pool.identity
    subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
    catalog, files = (root / "catalog.db").read_bytes(), files_of(root)
    script = f"from archive_manager import ArchiveManager; ArchiveManager.open({str(copy)!r}, rebind=True)"
    env = {**os.environ, failpoints.ENV: f"{point}=kill"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert (root / "catalog.db").read_bytes() == catalog and files_of(root) == files
    with contextlib.suppress(PoolIdentityError):  # refused if the kill came after the file
        ArchiveManager.open(copy, rebind=True).close()
    with ArchiveManager.open(copy) as pool:
        assert pool.identity is not None and original is not None
        assert pool.identity.pool_id != original.pool_id
        assert_loads(pool, "a", tiny_rollout())
    assert (root / "catalog.db").read_bytes() == catalog and files_of(root) == files
    with ArchiveManager.open(root) as pool:
        assert pool.identity is not None and pool.identity.same_as(original)


def test_rebind_refuses_a_copy_that_shares_the_originals_live_catalog_log(tmp_path: Path) -> None:
    """A ``cp -al`` taken while the original was open links its ``catalog.db-wal`` and
    ``-shm`` too: the copy's catalog is then the original's live database, not a copy of it.
    Refused before anything is written, saying so."""
    root, copy = tmp_path / "pool", tmp_path / "copy"
    with ArchiveManager.open(root) as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        with pool.catalog.read():
            subprocess.run(["cp", "-al", str(root), str(copy)], check=True)
        assert (copy / "catalog.db-wal").stat().st_nlink > 1
        files, copied = files_of(root), files_of(copy)
        with pytest.raises(PoolIdentityError, match="hard link"):
            ArchiveManager.open(copy, rebind=True)
        assert files_of(root) == files and files_of(copy) == copied
        assert_loads(pool, "a", tiny_rollout())
    with ArchiveManager.open(root) as pool:
        assert_loads(pool, "a", tiny_rollout())


# --------------------------------------------------------------------------- older pools


def test_a_pool_written_before_identities_gets_one_on_first_open(tmp_path: Path) -> None:
    root = extract_legacy(tmp_path)
    assert read_identity(root) is None
    with ArchiveManager.open(root) as pool:
        found = read_identity(root)
        assert found is not None and pool.identity is not None
        assert found.same_as(pool.identity)
        kept = pool.open_archive("kept")
        assert len(kept.load_samples()) == 6
        assert pool.open_archive("released").state == "released"
        owners = {o.owner for o in pool.owners().owners}
        assert "checkpoint:step-1" in owners
        assert pool.verify(read_data=True).ok
    with ArchiveManager.open(root) as pool:
        assert pool.identity is not None and pool.identity.same_as(found)


def test_a_pool_written_before_identities_refuses_a_catalog_that_does_not_index_it(
    tmp_path: Path,
) -> None:
    root = extract_legacy(tmp_path)
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(root, catalog_url=f"sqlite:///{tmp_path / 'new.db'}")
    # ...and its own catalog still claims it afterwards.
    with ArchiveManager.open(root) as pool:
        assert len(pool.open_archive("kept")) == 6


def test_a_filesystem_without_hard_links_still_gets_an_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def no_links(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with ArchiveManager.open(tmp_path / "pool") as pool:
        pool.save("a", tiny_rollout(), rollout_id=1)
        assert pool.identity is not None and pool.identity.same_as(read_identity(pool.root))
    with pytest.raises(PoolIdentityError):
        ArchiveManager.open(tmp_path / "pool", catalog_url=f"sqlite:///{tmp_path / 'x.db'}")


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


def test_an_open_racing_the_pools_creation_binds_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first opens of one new pool (two ranks, two RolloutArchive saves): the one that reads
    the root while the other creates the pool must take the pool the other created.  It read
    the identity file before the catalog, so with the creation landing between the two reads
    it saw the catalog's new identity and no file, and refused the pool as an emptied root
    (PoolRootMissingError; found by tests/interop/test_compat.py's race, once)."""
    from archive_manager.pool import identity

    root = tmp_path / "pool"
    real = identity.read_identity
    created: list[str] = []

    def creation_lands_now(at: Path) -> identity.PoolIdentity | None:
        seen = real(at)
        if not created:
            created.append("other")
            other = threading.Thread(target=lambda: ArchiveManager.open(root).close())
            other.start()
            other.join()
        return seen

    monkeypatch.setattr(identity, "read_identity", creation_lands_now)
    with ArchiveManager.open(root) as pool:
        assert created == ["other"]
        assert pool.save("a", tiny_rollout(seed=1), rollout_id=1).name == "a"
    monkeypatch.undo()
    with ArchiveManager.open(root) as pool:
        assert [a.name for a in pool.find()] == ["a"]
