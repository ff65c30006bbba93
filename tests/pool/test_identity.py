"""Pool identity: a catalog and a blob root are one pool's, or the open is refused.

Each test is an operator's mistake that lost published archives before identities existed:
a second catalog on one blob root, a copied pool, a lost catalog "fixed" by making a new one,
a stale catalog used after the root was taken over, a damaged identity file.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from helpers import Backend, assert_loads, extract_legacy, open_on, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.errors import GcAbortedError, PoolIdentityError, PoolNotFoundError
from archive_manager.pool.identity import IDENTITY_FILE, SPARE_FILE, read_identity

DATA = Path(__file__).parents[1] / "data"


def other_url(backend: Backend, tmp_path: Path) -> str:
    """A second, empty catalog on the same kind of engine."""
    if backend.name == "postgresql":
        return backend.new_url()
    return f"sqlite:///{tmp_path / 'elsewhere' / 'other.db'}"


def blob_count(root: Path) -> int:
    return sum(1 for p in (root / "blobs").rglob("*") if p.is_file() and p.name != SPARE_FILE)


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
    import os

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
    source = make_url(backend.url(root)).database
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
    import os

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
