"""PostgreSQL-only behaviour of the catalog: the advisory write lock, lock timeouts, isolation,
and errors mapped to one-line `CatalogError`s. (Everything both backends share runs in
tests/catalog/test_catalog.py and tests/catalog/test_catalog_migrations.py on both.)"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from pgserver import PgServer
from sqlalchemy import insert, select, text, update

from archive_manager import ArchiveManager, RolloutArchive
from archive_manager.catalog import Catalog, archives_table, pool_info_table
from archive_manager.catalog.dialects.postgresql import PG_WRITE_LOCK
from archive_manager.catalog.engine import make_engine
from archive_manager.catalog.migrate import CATALOG_URL_ENV
from archive_manager.compat import POINTER_VERSION
from archive_manager.errors import CatalogError, CatalogLockedError, ForeignCatalogError


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url)


def _add_archive(conn, name: str) -> None:
    conn.execute(
        insert(archives_table).values(
            name=name, evaluation=False, state="published", samples=0, bytes=0, created_at=1.0
        )
    )


class _LockHolder:
    """Another session holding the catalog's write lock (as a writer mid-transaction does)."""

    def __init__(self, server: PgServer, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(
            host=server.host, port=server.port, user="postgres", dbname=url.rsplit("/", 1)[1]
        )
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [PG_WRITE_LOCK])

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def test_write_lock_held_too_long_raises_catalog_locked_quickly(pg_server, pg_url) -> None:
    Catalog.open(pg_url).close()
    holder = _LockHolder(pg_server, pg_url)
    try:
        with Catalog.open(pg_url, busy_timeout_ms=200) as catalog:
            with catalog.read() as conn:  # readers never wait for the write lock
                assert conn.execute(select(archives_table)).all() == []
            started = time.monotonic()
            with (
                pytest.raises(CatalogLockedError, match="busy timeout") as info,
                catalog.write() as conn,
            ):
                _add_archive(conn, "a")
            assert time.monotonic() - started < 5
            assert isinstance(info.value, TimeoutError)
            assert "200 ms" in str(info.value) and "advisory" in str(info.value)
            with catalog.read() as conn:
                assert conn.execute(select(archives_table)).all() == []
    finally:
        holder.release()


def test_writer_waits_for_the_lock_holder(pg_server, pg_url) -> None:
    Catalog.open(pg_url).close()
    holder = _LockHolder(pg_server, pg_url)
    releaser = threading.Timer(0.7, holder.release)
    releaser.start()
    try:
        with Catalog.open(pg_url, busy_timeout_ms=30_000) as catalog:
            started = time.monotonic()
            with catalog.write() as conn:
                _add_archive(conn, "a")
            assert time.monotonic() - started >= 0.3
    finally:
        releaser.join()


def test_open_waits_for_a_writer_and_ignores_its_uncommitted_rows(pg_url) -> None:
    """A second writer, in another pool object, sees the first one's rows once it has the lock
    (READ COMMITTED after the lock: what BEGIN IMMEDIATE gives on SQLite)."""
    with Catalog.open(pg_url) as first, Catalog.open(pg_url) as second:
        seen: list[int] = []
        holds = threading.Event()

        def other() -> None:
            holds.wait()
            with second.write() as conn:
                seen.append(len(conn.execute(select(archives_table)).all()))

        thread = threading.Thread(target=other)
        thread.start()
        with first.write() as conn:
            _add_archive(conn, "a")
            holds.set()
            time.sleep(0.3)
        thread.join()
        assert seen == [1]


def test_reads_are_repeatable_read_and_writes_read_committed(pg_url) -> None:
    with Catalog.open(pg_url) as catalog:
        with catalog.read() as conn:
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"
        with catalog.write() as conn:
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "read committed"
            assert conn.execute(text("SHOW lock_timeout")).scalar() in ("30s", "30000ms")
            locks = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND pid = pg_backend_pid() AND granted"
                )
            ).scalar()
            assert locks == 1
        with catalog.read() as conn:  # the pooled connection is back at REPEATABLE READ
            assert conn.execute(text("SHOW transaction_isolation")).scalar() == "repeatable read"


def test_bare_postgresql_url_uses_psycopg(pg_server: PgServer, pg_url: str) -> None:
    bare = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with Catalog.open(bare) as catalog:
        assert catalog.engine.dialect.driver == "psycopg"
        assert catalog.get_pool_info("format_version") == "1"


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # "import psycopg" now fails
    with pytest.raises(
        CatalogError, match=r"pip install -e '\.\[postgres\]' in a checkout"
    ) as info:
        make_engine("postgresql+psycopg://user@db.example/pool")
    assert "psycopg" in str(info.value) and "\n" not in str(info.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_a_one_line_catalog_error(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://someone:secret@127.0.0.1:{_closed_port()}/pool"
    with pytest.raises(CatalogError, match="cannot reach the catalog server") as info:
        Catalog.open(url, busy_timeout_ms=1000)
    message = str(info.value)
    assert "\n" not in message and "refused" in message.lower()
    assert "secret" not in message  # the password is never shown
    with pytest.raises(CatalogError, match="cannot reach"):
        ArchiveManager.open(tmp_path / "pool", catalog_url=url)


def test_unknown_role_and_database_are_one_line_catalog_errors(pg_server: PgServer) -> None:
    no_role = pg_server.url().replace("postgres@", "nobody@")
    with pytest.raises(CatalogError, match="refused the login") as info:
        Catalog.open(no_role)
    assert "nobody" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CatalogError, match="does not exist") as info:
        Catalog.open(pg_server.url("no_such_database"))
    assert "CREATE DATABASE" in str(info.value)


def test_deadlock_and_serialization_failure_are_catalog_errors(pg_url: str) -> None:
    """Not something archive_manager writers can cause (one lock, taken first); a foreign
    program can, through the same tables: the error says so, one line, nothing committed."""
    with Catalog.open(pg_url) as catalog:
        with catalog.write() as conn:
            conn.execute(insert(pool_info_table), [{"key": "a"}, {"key": "b"}])
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def touch(first: str, second: str) -> None:
            try:
                # read() transactions can write (they are rolled back): a stand-in for a
                # foreign program that does not take the write lock.
                with catalog.read() as conn:
                    t = pool_info_table
                    conn.execute(update(t).where(t.c.key == first).values(value="x"))
                    barrier.wait(timeout=10)
                    conn.execute(update(t).where(t.c.key == second).values(value="x"))
            except CatalogError as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=touch, args=("a", "b")),
            threading.Thread(target=touch, args=("b", "a")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(errors) == 1, errors
        assert "deadlock" in str(errors[0]) and "another program" in str(errors[0])

        # Serialization failure: a REPEATABLE READ snapshot updating a row changed since.
        t = pool_info_table
        with pytest.raises(CatalogError, match="serialization failure"), catalog.read() as conn:
            conn.execute(select(t)).all()  # takes the snapshot
            with catalog.write() as other:
                other.execute(update(t).where(t.c.key == "a").values(value="y"))
            conn.execute(update(t).where(t.c.key == "a").values(value="z"))


def test_pool_on_postgresql_binds_its_blob_root(pg_url: str, tmp_path: Path) -> None:
    with ArchiveManager.open(tmp_path / "a", catalog_url=pg_url) as pool:
        assert pool.catalog.get_pool_info("blob_root") == str((tmp_path / "a").resolve())
        pool.save("x", [{"index": 0, "tokens": [1, 2]}], rollout_id=1)
    # Same root again: fine. Another root with the same catalog: refused.
    with ArchiveManager.open(tmp_path / "a", catalog_url=pg_url) as pool:
        assert [i.name for i in pool.find()] == ["x"]
    with pytest.raises(CatalogError, match="belongs to the pool at"):
        ArchiveManager.open(tmp_path / "b", catalog_url=pg_url)
    # The same blob root at another path (another machine's mount point) carries the pool's
    # identity: it opens, and the recorded root stays what the other machines use.
    (tmp_path / "a").rename(tmp_path / "moved")
    with ArchiveManager.open(tmp_path / "moved", catalog_url=pg_url) as pool:
        assert [i.name for i in pool.find()] == ["x"]
        assert pool.catalog.get_pool_info("blob_root") == str((tmp_path / "a").resolve())


# --------------------------------------------------------------------------- pointer files

SECRET = "s3cret-pw"


def with_password(url: str) -> str:
    """``url`` logging in with a password (the throwaway server trusts loopback, so any
    password is accepted: what matters is where it ends up)."""
    return url.replace("://postgres@", f"://postgres:{SECRET}@", 1)


def _files_text(folder: Path) -> str:
    return "".join(
        p.read_bytes().decode("utf-8", "replace") for p in folder.rglob("*") if p.is_file()
    )


def test_facade_on_a_server_catalog_writes_and_shows_no_password(
    pg_server: PgServer, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CATALOG_URL_ENV, raising=False)
    secret_url = with_password(pg_url)
    args = SimpleNamespace(archive_root=str(tmp_path / "shared"), archive_catalog_url=secret_url)
    samples = [{"index": i, "tokens": [1, 2, i]} for i in range(3)]
    path = tmp_path / "run" / "rollout_0.json"
    old = os.umask(0o022)
    try:
        RolloutArchive.save(path, samples, rollout_id=0, args=args)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the team: nothing secret in it
    pointer = json.loads(path.read_text())
    assert pointer["version"] == POINTER_VERSION and pointer["catalog"] == pg_url
    assert SECRET not in _files_text(tmp_path)  # not in the pointer, not in the pool root

    # Without the caller's URL the pointer is refused, and nothing connects.
    with pytest.raises(ForeignCatalogError, match="catalog_url=") as info:
        RolloutArchive(path)
    assert pg_url in str(info.value)
    # With it (argument, args or environment), it opens; nothing shown holds the password.
    for how in ({"catalog_url": secret_url}, {"args": args}, {}):
        if not how:
            monkeypatch.setenv(CATALOG_URL_ENV, secret_url)
        with RolloutArchive(path, **how) as arc:
            assert arc.load_samples() == samples
            shown = [repr(arc), repr(arc.pool), repr(arc.pool.catalog), json.dumps(arc.pointer)]
            shown.append(str(arc.pool.info().catalog_url))
            assert not [s for s in shown if SECRET in s], shown
    # Another database of the same server is another catalog: refused before connecting.
    other = pg_server.create_database()
    try:
        monkeypatch.setenv(CATALOG_URL_ENV, with_password(other))
        with pytest.raises(ForeignCatalogError, match="not the configured") as info:
            RolloutArchive(path)
        assert SECRET not in str(info.value)
    finally:
        pg_server.drop_database(other)
    monkeypatch.delenv(CATALOG_URL_ENV)

    # A version 1 pointer held the password; it opens with the caller's URL and never
    # shows the password, not even when refused.
    v1 = {k: v for k, v in pointer.items() if k != "catalog"}
    v1_path = tmp_path / "run" / "old.json"
    v1_path.write_text(json.dumps({**v1, "version": 1, "catalog_url": secret_url}))
    with pytest.raises(ForeignCatalogError) as info:
        RolloutArchive(v1_path)
    assert SECRET not in str(info.value) and pg_url in str(info.value)
    with RolloutArchive(v1_path, catalog_url=secret_url) as arc:
        assert arc.load_samples() == samples
        assert SECRET not in json.dumps(arc.pointer) and arc.pointer["catalog"] == pg_url
    with RolloutArchive(v1_path, catalog_url=pg_url) as arc:  # trust auth: no password needed
        assert len(arc) == 3
    v1_path.unlink()  # the only file here that ever held the password: the test wrote it

    # A reference save opens its source with the saver's catalog.
    RolloutArchive.save(
        tmp_path / "run" / "replay_0.json", None, rollout_id=0, args=args, reference=path
    )
    with RolloutArchive(tmp_path / "run" / "replay_0.json", args=args) as ref:
        assert ref.load_samples() == samples
    # Saving the path again after release: a new generation, same rules.
    with RolloutArchive(path, args=args) as arc:
        arc.release()
    path.unlink()
    RolloutArchive.save(path, samples[:1], rollout_id=0, args=args)
    with RolloutArchive(path, args=args) as arc:
        assert arc.load_samples() == samples[:1] and arc.name.endswith("%~2")
    assert SECRET not in _files_text(tmp_path)
