"""Tests of archive_manager.catalog: engine set-up, transactions, errors, schema behaviour."""

from __future__ import annotations

import _thread
import functools
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, func, insert, select, text

from archive_manager import ArchiveManager
from archive_manager.catalog import (
    FORMAT_VERSION,
    Catalog,
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    insert_rows,
    lease_blobs_table,
    leases_table,
    retention_table,
    sample_metadata_table,
)
from archive_manager.catalog import engine as catalog_engine
from archive_manager.catalog.dialects import postgresql as postgresql_dialect
from archive_manager.catalog.dialects import sqlite as sqlite_dialect
from archive_manager.catalog.dialects.base import compact_json
from archive_manager.catalog.engine import (
    PG_WRITE_LOCK,
    check_journal_mode,
    check_local_filesystem,
    filesystem_type,
    idle_in_transaction_timeout_ms,
    is_network_filesystem,
    make_engine,
    resolve_busy_timeout_ms,
)
from archive_manager.errors import (
    CatalogError,
    CatalogLockedError,
    UnsupportedFilesystemError,
)

# --- fixtures and helpers ---------------------------------------------------------------


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "catalog.db"


@pytest.fixture
def catalog_url(db_path: Path, backend) -> str:
    """A new catalog's URL: a SQLite file, or a new PostgreSQL database."""
    return sqlite_url(db_path) if backend.name == "sqlite" else backend.new_url()


@pytest.fixture
def catalog(catalog_url: str) -> Iterator[Catalog]:
    with Catalog.open(catalog_url) as opened:
        yield opened


def add_archive(conn: Connection, name: str, **values: Any) -> int:
    row = {
        "name": name,
        "evaluation": False,
        "state": "published",
        "samples": 0,
        "bytes": 0,
        "created_at": 1.0,
        **values,
    }
    key = conn.execute(insert(archives_table).values(**row)).inserted_primary_key
    assert key is not None
    return key[0]


def count(conn: Connection, table: Any) -> int:
    return conn.execute(select(func.count()).select_from(table)).scalar_one()


def count_archives(catalog: Catalog) -> int:
    with catalog.read() as conn:
        return count(conn, archives_table)


# --- engine set-up ----------------------------------------------------------------------


def test_pragmas_are_set_and_checked(tmp_path: Path) -> None:
    with Catalog.open(sqlite_url(tmp_path / "c.db"), busy_timeout_ms=1234) as catalog:
        assert catalog.dialect_name == "sqlite"
        with catalog.read() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234


def test_busy_timeout_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCHIVE_MANAGER_BUSY_TIMEOUT_MS", "4321")
    assert resolve_busy_timeout_ms() == 4321
    assert resolve_busy_timeout_ms(7) == 7
    with Catalog.open(sqlite_url(tmp_path / "c.db")) as catalog, catalog.read() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 4321
    monkeypatch.setenv("ARCHIVE_MANAGER_BUSY_TIMEOUT_MS", "soon")
    with pytest.raises(CatalogError, match="ARCHIVE_MANAGER_BUSY_TIMEOUT_MS"):
        resolve_busy_timeout_ms()
    monkeypatch.delenv("ARCHIVE_MANAGER_BUSY_TIMEOUT_MS")
    assert resolve_busy_timeout_ms() == 30_000


def test_journal_mode_answer_is_checked() -> None:
    check_journal_mode(("wal",), "c.db")
    for answer in [("delete",), ("memory",), None]:
        with pytest.raises(CatalogError, match="WAL"):
            check_journal_mode(answer, "c.db")


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(CatalogError, match="in-memory"):
        make_engine("sqlite://")


@pytest.mark.parametrize(
    "url",
    [
        "mysql+pymysql://user:s3cret@db.example/pool",
        "mariadb://user@db.example/pool",
        "mssql+pyodbc://user@db.example/pool",
        "oracle://user@db.example/pool",
    ],
)
def test_other_databases_are_refused(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database without the write lock the save and GC protocols rely on is refused
    (issue 16: a MySQL URL used to get a plain engine, with no lock and no error mapping),
    before any engine is made; the message names the supported ones and hides the password."""

    def no_engine(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no engine may be made for an unsupported database")

    for module in (sqlite_dialect, postgresql_dialect):
        monkeypatch.setattr(module, "create_engine", no_engine)
    for call in (make_engine, catalog_engine.dialect_of):
        with pytest.raises(CatalogError, match="does not support") as info:
            call(url)
        message = str(info.value)
        assert "sqlite" in message and "postgresql" in message
        assert "s3cret" not in message


def test_supported_dialects() -> None:
    assert catalog_engine.dialect_of("sqlite:////pool/catalog.db") == "sqlite"
    assert catalog_engine.dialect_of("sqlite+pysqlite:////pool/catalog.db") == "sqlite"
    assert catalog_engine.dialect_of("postgresql://db/pool") == "postgresql"
    assert catalog_engine.dialect_of("postgresql+psycopg://db/pool") == "postgresql"


def test_open_on_another_database_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    with pytest.raises(CatalogError, match="'mysql'"):
        ArchiveManager.open(root, "mysql+pymysql://user@db.example/pool")
    with pytest.raises(CatalogError, match="'mysql'"):
        ArchiveManager.catalog_status(root, "mysql+pymysql://user@db.example/pool")
    assert not root.exists()


def test_corrupt_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a SQLite database\n" * 200)
    with pytest.raises(CatalogError, match=r"garbage\.db") as info:
        Catalog.open(sqlite_url(path))
    assert "not a usable SQLite database" in str(info.value)


def test_truncated_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with Catalog.open(sqlite_url(path)) as catalog, catalog.write() as conn:
        add_archive(conn, "a")
    assert not Path(f"{path}-wal").exists()  # the last close checkpointed the WAL
    with path.open("r+b") as f:
        f.truncate(5000)
    with pytest.raises(CatalogError, match=r"c\.db") as info:
        Catalog.open(sqlite_url(path))
    assert "truncated or corrupt" in str(info.value)


def test_missing_folder_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot open the catalog file"):
        Catalog.open(sqlite_url(tmp_path / "absent" / "c.db"))


# --- transactions -----------------------------------------------------------------------


def test_write_commits_and_read_sees_it(catalog: Catalog) -> None:
    with catalog.write() as conn:
        add_archive(conn, "a")
    assert count_archives(catalog) == 1


def test_exception_in_write_rolls_back(catalog: Catalog) -> None:
    with pytest.raises(RuntimeError), catalog.write() as conn:
        add_archive(conn, "a")
        raise RuntimeError("boom")
    assert count_archives(catalog) == 0


def test_read_never_commits(catalog: Catalog) -> None:
    with catalog.read() as conn:
        add_archive(conn, "a")  # a deferred transaction may write; it is rolled back
    assert count_archives(catalog) == 0


def test_nested_write_on_one_thread_is_refused(catalog: Catalog) -> None:
    with catalog.write(), pytest.raises(CatalogError, match="already open"), catalog.write():
        pass
    with catalog.write() as conn:  # the flag is cleared again
        add_archive(conn, "a")


def test_closed_catalog_refuses_transactions(catalog_url: str) -> None:
    catalog = Catalog.open(catalog_url)
    catalog.close()
    catalog.close()
    with pytest.raises(CatalogError, match="closed"), catalog.read():
        pass


def test_begin_statements(catalog: Catalog) -> None:
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(catalog.engine, "before_cursor_execute", record)
    try:
        with catalog.write() as conn:
            conn.execute(text("SELECT 1"))
        with catalog.read() as conn:
            conn.execute(text("SELECT 2"))
    finally:
        event.remove(catalog.engine, "before_cursor_execute", record)
    if catalog.dialect_name == "sqlite":
        assert statements == ["BEGIN IMMEDIATE", "SELECT 1", "BEGIN", "SELECT 2"]
    else:
        # The write lock and the writer's idle bound go with BEGIN, in one round trip;
        # readers get one snapshot.
        idle = idle_in_transaction_timeout_ms(catalog._busy_timeout_ms)
        bound = f"SET LOCAL idle_in_transaction_session_timeout = {idle}"
        lock = f"SELECT pg_advisory_xact_lock({PG_WRITE_LOCK})"
        assert statements == [
            f"BEGIN ISOLATION LEVEL READ COMMITTED; {bound}; {lock}",
            "SELECT 1",
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "SELECT 2",
        ]


def _commit_setting(conn: Connection, dialect: str) -> str:
    if dialect == "sqlite":
        return {1: "NORMAL", 2: "FULL"}[
            int(conn.exec_driver_sql("PRAGMA synchronous").scalar_one())
        ]
    return str(conn.exec_driver_sql("SHOW synchronous_commit").scalar_one())


def test_a_lazy_write_is_the_only_one_not_waited_for(catalog: Catalog) -> None:
    """``write(durable=False)`` (a save's lease) commits without waiting for the disk; the
    pooled connection it used is durable again for the next transaction, write or read."""
    dialect = catalog.dialect_name
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with catalog.write() as conn:
        durable = _commit_setting(conn, dialect)  # the server's own setting on PostgreSQL
    assert dialect == "postgresql" or durable == "FULL"
    event.listen(catalog.engine, "before_cursor_execute", record)
    try:
        with catalog.write(durable=False) as conn:
            assert _commit_setting(conn, dialect) in ("NORMAL", "off")
            add_archive(conn, "lazy")
    finally:
        event.remove(catalog.engine, "before_cursor_execute", record)
    lazy = (
        "PRAGMA synchronous = NORMAL"
        if dialect == "sqlite"
        else "SET LOCAL synchronous_commit = off"
    )
    assert lazy in statements
    assert count_archives(catalog) == 1  # committed, seen by the next transaction
    for _ in range(3):  # whichever pooled connection comes next
        with catalog.write() as conn:
            assert _commit_setting(conn, dialect) == durable
        with catalog.read() as conn:
            assert _commit_setting(conn, dialect) == durable


def test_read_sees_one_snapshot(catalog: Catalog) -> None:
    with catalog.write() as conn:
        add_archive(conn, "a")
    with catalog.read() as conn:
        assert count(conn, archives_table) == 1
        writer = threading.Thread(target=lambda: _write_archive(catalog, "b"))
        writer.start()
        writer.join()
        assert count(conn, archives_table) == 1  # still the snapshot taken at first read
    assert count_archives(catalog) == 2


def _write_archive(catalog: Catalog, name: str) -> None:
    with catalog.write() as conn:
        add_archive(conn, name)


def test_second_writer_waits_for_the_first(catalog: Catalog) -> None:
    first_holds = threading.Event()
    timeline: list[tuple[str, float]] = []

    def first() -> None:
        with catalog.write() as conn:
            add_archive(conn, "first")
            first_holds.set()
            time.sleep(0.5)
            timeline.append(("first commits", time.monotonic()))

    def second() -> None:
        first_holds.wait()
        # Read-then-write is the pattern that fails under deferred BEGIN (busy snapshot).
        with catalog.write() as conn:
            timeline.append(("second begins", time.monotonic()))
            names = conn.execute(select(archives_table.c.name)).scalars().all()
            add_archive(conn, f"second saw {len(names)}")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [what for what, _ in sorted(timeline, key=lambda t: t[1])] == [
        "first commits",
        "second begins",
    ]
    with catalog.read() as conn:
        names = set(conn.execute(select(archives_table.c.name)).scalars())
    assert names == {"first", "second saw 1"}


def test_reader_is_not_blocked_by_a_writer(catalog: Catalog) -> None:
    with catalog.write() as conn:
        add_archive(conn, "a")
        started = time.monotonic()
        result: list[int] = []
        reader = threading.Thread(target=lambda: result.append(count_archives(catalog)))
        reader.start()
        reader.join(timeout=10)
        assert result == [0]  # WAL: the reader sees the last commit, without waiting
        assert time.monotonic() - started < 5


_HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def test_lock_held_too_long_raises_catalog_locked_quickly(db_path: Path) -> None:
    Catalog.open(sqlite_url(db_path)).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(db_path), "20"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with Catalog.open(sqlite_url(db_path), busy_timeout_ms=200) as catalog:
            assert count_archives(catalog) == 0  # readers still work
            started = time.monotonic()
            with pytest.raises(CatalogLockedError, match="busy timeout") as info:
                _write_archive(catalog, "a")
            assert time.monotonic() - started < 5
            assert isinstance(info.value, TimeoutError)
            assert str(db_path) in str(info.value)
    finally:
        holder.kill()
        holder.communicate()


def test_writer_waits_for_another_process(db_path: Path) -> None:
    Catalog.open(sqlite_url(db_path)).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(db_path), "0.7"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with Catalog.open(sqlite_url(db_path), busy_timeout_ms=30_000) as catalog:
            started = time.monotonic()
            _write_archive(catalog, "a")
            assert time.monotonic() - started >= 0.3
            assert count_archives(catalog) == 1
    finally:
        holder.communicate(timeout=30)


def _child_writes(url: str) -> None:
    with Catalog.open(url) as child:
        _write_archive(child, "from child")


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_forked_child_does_not_reuse_pooled_connections(catalog: Catalog) -> None:
    assert count_archives(catalog) == 0  # leaves a connection in the parent's pool
    context = multiprocessing.get_context("fork")

    def child_main() -> None:
        # The inherited engine must hand out a fresh connection, not the parent's.
        _write_archive(catalog, "inherited engine")
        _child_writes(catalog.url)

    child = context.Process(target=child_main)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    with catalog.read() as conn:
        names = set(conn.execute(select(archives_table.c.name)).scalars())
    assert names == {"inherited engine", "from child"}


def _held_write(catalog: Catalog, name: str, seconds: float) -> threading.Thread:
    """A thread inside a write transaction of ``catalog`` (archive ``name`` added), which
    it ends ``seconds`` from now; returned once the transaction holds the lock."""
    inside, release = threading.Event(), threading.Event()

    def holder() -> None:
        with catalog.write() as conn:
            add_archive(conn, name, samples=1, bytes=1)
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert inside.wait(30)
    threading.Timer(seconds, release.set).start()
    return thread


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_fork_waits_for_a_write_transaction_in_flight(catalog: Catalog) -> None:
    """A child forked while another thread's write transaction held the catalog's lock (a
    `save_async` worker committing as a training loop forks workers) inherited SQLite's
    per-process lock table with that lock held, so every write of the child waited its busy
    timeout and failed with `CatalogLockedError` (30 s). The fork now waits for the
    transaction to end (`catalog.forks`)."""
    thread = _held_write(catalog, "parent", 1.0)  # ends while the fork waits
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_child_writes, args=(catalog.url,))
    started = time.monotonic()
    child.start()
    waited = time.monotonic() - started
    child.join(timeout=60)
    thread.join(30)
    assert child.exitcode == 0
    if catalog.dialect_name == "sqlite":
        assert waited >= 0.5  # the fork waited for the transaction
    with catalog.read() as conn:
        names = set(conn.execute(select(archives_table.c.name)).scalars())
    assert names == {"parent", "from child"}


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_fork_does_not_wait_for_a_write_still_asking_for_the_lock(
    catalog: Catalog, db_path: Path
) -> None:
    """A write transaction waiting for another process's lock holds nothing a child could
    inherit: a fork waited its whole bound (10 s) for it, each worker of a DataLoader or a
    multiprocessing pool started then."""
    if catalog.dialect_name != "sqlite":
        pytest.skip("the gate is SQLite's")
    count_archives(catalog)  # the catalog file exists, in WAL mode
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"

        def writer() -> None:
            _write_archive(catalog, "after the locker")

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(0.3)  # the writer now waits in BEGIN IMMEDIATE
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
        started = time.monotonic()
        child.start()
        waited = time.monotonic() - started
        child.join(30)
        assert waited < 2.0  # ASKING_WAIT_S, not FORK_WAIT_S
    finally:
        locker.kill()
        locker.communicate()
    thread.join(60)
    assert count_archives(catalog) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_ctrl_c_during_a_forks_wait_is_raised_after_the_fork(catalog: Catalog) -> None:
    """CPython ignores an exception raised in a fork hook, so a Ctrl-C during the wait was
    lost and the fork went on without waiting; the wait now goes on and the interrupt is
    raised once the fork returned."""
    if catalog.dialect_name != "sqlite":
        pytest.skip("the gate is SQLite's")
    thread = _held_write(catalog, "held", 1.5)
    threading.Timer(0.5, _thread.interrupt_main).start()  # Ctrl-C, during the wait
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        child.start()
        waited = time.monotonic() - started
        time.sleep(5)  # the interrupt comes a moment after the fork
    child.join(30)
    thread.join(30)
    assert waited >= 1.0  # the fork still waited for the transaction


def test_the_fork_gate_counts_a_write_that_never_got_its_lock_inside_another() -> None:
    """A write of a second catalog refused before it held its lock, inside a first one's
    (one thread, two pools): it counted as holding, so the counts drifted and later forks
    waited for a transaction that did not exist."""
    from archive_manager.catalog import forks

    def counts() -> tuple[int, int]:
        return forks._gate.asking, forks._gate.holding

    before = counts()
    outer = forks.begin_write()
    forks.holding(outer)
    inner = forks.begin_write()
    forks.end_write(inner)  # refused: never held its lock
    assert counts() == (before[0], before[1] + 1)
    forks.end_write(outer)
    assert counts() == before


_LOCKER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_a_signal_handler_that_writes_during_a_forks_wait_does_not_hang(catalog: Catalog) -> None:
    """A signal handler (a preemption handler saving a checkpoint) runs on the main thread
    while its fork waits for another thread's transaction: its write waited for the fork to
    end, the fork for the handler: for ever. The forking thread's own writes go through."""
    if catalog.dialect_name != "sqlite":
        pytest.skip("the gate is SQLite's")
    thread = _held_write(catalog, "held", 1.5)
    previous = signal.signal(signal.SIGALRM, lambda *_: _write_archive(catalog, "handler"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
        child.start()  # waits for the holder; the handler runs meanwhile
        child.join(30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    thread.join(30)
    with catalog.read() as conn:
        names = set(conn.execute(select(archives_table.c.name)).scalars())
    assert names == {"held", "handler"}


# --- pool info ----------------------------------------------------------------------------


def test_pool_info_helpers(catalog: Catalog) -> None:
    assert catalog.get_pool_info("format_version") == str(FORMAT_VERSION)
    assert catalog.get_pool_info("blob_root") is None
    catalog.set_pool_info("blob_root", "/pool/blobs")
    catalog.set_pool_info("blob_root", "/pool/blobs2")
    assert catalog.pool_info() == {"format_version": "1", "blob_root": "/pool/blobs2"}


# --- schema behaviour ---------------------------------------------------------------------


def fill_archive(conn: Connection, name: str, digest: str) -> int:
    """One archive with a row in every child table; returns its id."""
    archive_id = add_archive(conn, name, samples=2, bytes=10, attrs={"k": [1, 2]})
    conn.execute(
        insert(blobs_table),
        [
            {"digest": digest, "size": 10, "kind": "chunk", "state": "live", "created_at": 1.0},
        ],
    )
    conn.execute(
        insert(chunks_table),
        [{"archive_id": archive_id, "ordinal": 0, "digest": digest, "samples": 2, "size": 10}],
    )
    conn.execute(
        insert(entries_table),
        [
            {
                "archive_id": archive_id,
                "position": p,
                "sample_key": f"sample:{p}",
                "task_key": None if p else "task-0",
                "chunk_ordinal": 0,
                "offset": p,
            }
            for p in range(2)
        ],
    )
    conn.execute(
        insert(sample_metadata_table),
        [
            {
                "archive_id": archive_id,
                "position": p,
                "status": "completed",
                "reward": 0.5,
                "response_length": 3,
                "description": {"index": p, "tensors": {}},
            }
            for p in range(2)
        ],
    )
    conn.execute(
        insert(archive_blobs_table), [{"archive_id": archive_id, "digest": digest, "kind": "chunk"}]
    )
    conn.execute(
        insert(retention_table),
        [{"owner": f"archive:{name}", "archive_id": archive_id, "created_at": 1.0}],
    )
    return archive_id


def test_deleting_an_archive_cascades_to_its_rows(catalog: Catalog) -> None:
    with catalog.write() as conn:
        doomed = fill_archive(conn, "doomed", "a" * 32)
        kept = fill_archive(conn, "kept", "b" * 32)
    with catalog.write() as conn:
        conn.execute(archives_table.delete().where(archives_table.c.id == doomed))
    with catalog.read() as conn:
        for table in (
            chunks_table,
            entries_table,
            sample_metadata_table,
            archive_blobs_table,
            retention_table,
        ):
            ids = set(conn.execute(select(table.c.archive_id)).scalars())
            assert ids == {kept}, table.name
        # No FK to blobs: blob rows are GC's business, not the archive's.
        assert count(conn, blobs_table) == 2


def test_dropping_a_lease_drops_its_blobs(catalog: Catalog) -> None:
    with catalog.write() as conn:
        for owner in ("lease:1", "gc:2"):
            conn.execute(
                insert(leases_table).values(
                    owner=owner, expires_at=2.0, generation=1, created_at=1.0
                )
            )
            conn.execute(insert(lease_blobs_table).values(lease=owner, digest="c" * 32))
        conn.execute(leases_table.delete().where(leases_table.c.owner == "lease:1"))
    with catalog.read() as conn:
        assert conn.execute(select(lease_blobs_table.c.lease)).scalars().all() == ["gc:2"]


def test_foreign_keys_and_checks_are_enforced(catalog: Catalog) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError), catalog.write() as conn:
        conn.execute(
            insert(chunks_table).values(
                archive_id=999, ordinal=0, digest="d" * 32, samples=1, size=1
            )
        )
    with pytest.raises(IntegrityError), catalog.write() as conn:
        conn.execute(
            insert(blobs_table).values(
                digest="e" * 32, size=1, kind="chunk", state="gone", created_at=0.0
            )
        )
    with pytest.raises(IntegrityError), catalog.write() as conn:
        add_archive(conn, "same")
        add_archive(conn, "same")


def test_archive_ids_are_never_reused(catalog: Catalog) -> None:
    with catalog.write() as conn:
        first = add_archive(conn, "a")
        conn.execute(archives_table.delete())
        assert add_archive(conn, "b") > first


GC_REACHABILITY = """
SELECT b.digest FROM blobs AS b
WHERE b.state = 'live' AND b.created_at < :cutoff
  AND NOT EXISTS (
    SELECT 1 FROM archive_blobs AS ab JOIN retention AS r ON r.archive_id = ab.archive_id
    WHERE ab.digest = b.digest)
  AND NOT EXISTS (SELECT 1 FROM lease_blobs AS lb WHERE lb.digest = b.digest)
"""


def test_gc_reachability_query_is_served_by_indexes(db_path: Path) -> None:
    with Catalog.open(sqlite_url(db_path)) as catalog:  # reads SQLite's EXPLAIN QUERY PLAN
        with catalog.write() as conn:
            fill_archive(conn, "a", "a" * 32)
        with catalog.read() as conn:
            plan = conn.execute(text("EXPLAIN QUERY PLAN " + GC_REACHABILITY), {"cutoff": 5.0})
            details = [row[-1] for row in plan]
            # Blobs are walked once (by index or scan, as the planner likes); every per-blob
            # probe of the owning tables must be an index search, never a scan.
            probes = [
                d for d in details if d.startswith(("SCAN", "SEARCH")) and " b " not in d + " "
            ]
            assert all(d.startswith("SEARCH") for d in probes), details
            joined = "\n".join(details)
            for index in (
                "ix_archive_blobs_digest_archive_id",
                "ix_retention_archive_id",
                "ix_lease_blobs_digest",
            ):
                assert f"COVERING INDEX {index}" in joined, details
            assert conn.execute(text(GC_REACHABILITY), {"cutoff": 5.0}).all() == []
            conn.execute(retention_table.delete())
            assert conn.execute(text(GC_REACHABILITY), {"cutoff": 5.0}).all() == [("a" * 32,)]


# --- bulk inserts -------------------------------------------------------------------------

ENTRY_COLUMNS = ["archive_id", "position", "sample_key", "task_key", "chunk_ordinal", "offset"]


def test_insert_rows_matches_core_insert(catalog: Catalog) -> None:
    with catalog.write() as conn:
        archive_id = add_archive(conn, "a")
        rows = ((archive_id, p, f"sample:{p}", None, 0, p) for p in range(10))
        assert insert_rows(conn, entries_table, ENTRY_COLUMNS, rows, batch_size=3) == 10
        # Columns out of table order, and a JSON column needing its bind processor.
        metadata = (({"index": p}, None, p, archive_id) for p in range(10))
        columns = ["description", "reward", "position", "archive_id"]
        assert insert_rows(conn, sample_metadata_table, columns, metadata) == 10
    with catalog.read() as conn:
        entries = conn.execute(select(entries_table).order_by(entries_table.c.position)).all()
        assert [tuple(e) for e in entries] == [
            (archive_id, p, f"sample:{p}", None, 0, p) for p in range(10)
        ]
        descriptions = conn.execute(
            select(sample_metadata_table.c.description).order_by(sample_metadata_table.c.position)
        ).scalars()
        assert list(descriptions) == [{"index": p} for p in range(10)]


def test_insert_rows_of_many_rows(catalog: Catalog) -> None:
    """Enough rows for PostgreSQL's COPY path: JSON, NULLs, odd text, out-of-order columns."""
    from sqlalchemy.exc import IntegrityError

    n = 1500
    with catalog.write() as conn:
        archive_id = add_archive(conn, "a")
        descriptions = [
            {"index": p, "text": 'tab\t"quote"\\ \u00e9\n', "x": None} for p in range(n)
        ]
        rows = ((d, None if p % 3 else 0.5, p, archive_id) for p, d in enumerate(descriptions))
        columns = ["description", "reward", "position", "archive_id"]
        assert insert_rows(conn, sample_metadata_table, columns, rows, batch_size=700) == n
    with catalog.read() as conn:
        got = conn.execute(
            select(sample_metadata_table.c.description, sample_metadata_table.c.reward).order_by(
                sample_metadata_table.c.position
            )
        ).all()
    assert [tuple(r) for r in got] == [
        (d, None if p % 3 else 0.5) for p, d in enumerate(descriptions)
    ]
    # A broken foreign key is SQLAlchemy's IntegrityError on either path; nothing is kept.
    with pytest.raises(IntegrityError), catalog.write() as conn:
        insert_rows(
            conn,
            entries_table,
            ENTRY_COLUMNS,
            ((999, p, f"sample:{p}", None, 0, p) for p in range(n)),
        )
    with catalog.read() as conn:
        assert count(conn, entries_table) == 0


def test_insert_rows_rejects_unknown_columns(catalog: Catalog) -> None:
    with pytest.raises(ValueError, match="nope"), catalog.write() as conn:
        insert_rows(conn, entries_table, ["nope"], [(1,)])


def test_bulk_insert_matches_executemany(catalog: Catalog) -> None:
    """insert_rows (the fast path: COPY on PostgreSQL, multi-row VALUES on SQLite) stores
    exactly what Core's executemany stores; its speed is measured in tools/bench_catalog.py."""
    with catalog.write() as conn:
        ids = [add_archive(conn, name) for name in ("core", "fast")]
    rows = [(ids[0], p, f"sample:{p}", f"task-{p // 8}", p // 64, p % 64) for p in range(20_000)]
    dicts = [dict(zip(ENTRY_COLUMNS, row, strict=True)) for row in rows]
    with catalog.write() as conn:
        conn.execute(insert(entries_table), dicts)
    with catalog.write() as conn:
        insert_rows(conn, entries_table, ENTRY_COLUMNS, [(ids[1], *row[1:]) for row in rows])
    with catalog.read() as conn:
        stored = {
            archive_id: conn.execute(
                select(*(entries_table.c[c] for c in ENTRY_COLUMNS[1:]))
                .where(entries_table.c.archive_id == archive_id)
                .order_by(entries_table.c.position)
            ).all()
            for archive_id in ids
        }
    assert [tuple(r) for r in stored[ids[0]]] == [row[1:] for row in rows]
    assert stored[ids[0]] == stored[ids[1]]
    assert count_archives(catalog) == 2


@pytest.mark.parametrize("max_parameters", [32766, 999, 5])
def test_sqlite_bulk_insert_carries_many_rows_a_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_parameters: int
) -> None:
    """Many rows a statement, not the driver's executemany of one row a step: the driver
    lets go of the GIL at each step, and a background save behind a busy training loop then
    waited the switch interval for it back at every row.  Within SQLite's parameter limit
    (999 before 3.32; a statement of one row when even that is over it)."""
    monkeypatch.setattr(sqlite_dialect, "_MAX_PARAMETERS", max_parameters)
    per = max(1, min(sqlite_dialect._VALUES_ROWS, max_parameters // len(ENTRY_COLUMNS)))
    with Catalog.open(sqlite_url(tmp_path / "c.db")) as catalog:
        with catalog.write() as conn:
            archive_id = add_archive(conn, "a")
        steps: list[int] = []

        def count(*args: Any) -> None:
            parameters, many = args[3], args[5]
            steps.append(len(parameters) if many else 1)

        event.listen(catalog.engine, "before_cursor_execute", count)
        n = 1000
        rows = [(archive_id, p, f"sample:{p}", None, p // 64, p % 64) for p in range(n)]
        with catalog.write() as conn:
            steps.clear()
            assert insert_rows(conn, entries_table, ENTRY_COLUMNS, rows, batch_size=700) == n
            inserted = list(steps)
        # two batches (700 + 300), each in pages of `per` rows and one statement for the rest
        # (a step a row where not even one row's parameters fit: per == 1)
        assert sum(inserted) == sum(-(-b // per) for b in (700, 300))
        assert sum(inserted) < n / 100 or per == 1
        with catalog.read() as conn:
            stored = conn.execute(
                select(*(entries_table.c[c] for c in ENTRY_COLUMNS)).order_by(
                    entries_table.c.position
                )
            ).all()
        assert [tuple(r) for r in stored] == rows


@pytest.mark.parametrize(
    "make_rows",
    [
        lambda a: [(a, 0, "k0", "t", 0), (0, a, 1, "k1", None, 0, 1)],  # a short row, a long one
        lambda a: [
            dict(zip(ENTRY_COLUMNS, (a, p, f"s{p}", None, 0, p), strict=True)) for p in (0, 1)
        ],
    ],
    ids=["short-then-long", "dicts"],
)
def test_sqlite_bulk_insert_refuses_rows_that_do_not_fit_as_the_driver_does(
    tmp_path: Path, make_rows: Any
) -> None:
    """Rows that are not tuples of one value a column are refused as the driver's one row a
    step refused them, nothing kept: run together into one statement's values, a short row
    and a long one would have landed shifted into each other's columns, and a dict its keys."""
    from sqlalchemy.exc import ProgrammingError

    with Catalog.open(sqlite_url(tmp_path / "c.db")) as catalog:
        with catalog.write() as conn:
            archive_id = add_archive(conn, "a")
        with pytest.raises(ProgrammingError, match=r"[Bb]inding"), catalog.write() as conn:
            insert_rows(conn, entries_table, ENTRY_COLUMNS, make_rows(archive_id))
        with catalog.read() as conn:
            assert count(conn, entries_table) == 0


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Python 3.11+")
def test_sqlite_bulk_insert_keeps_within_the_connections_parameter_limit(tmp_path: Path) -> None:
    """A library built with a smaller SQLITE_MAX_VARIABLE_NUMBER than its version's default
    (or a connection that lowered it) gets statements within it, not "too many SQL variables"
    at every save."""
    with Catalog.open(sqlite_url(tmp_path / "c.db")) as catalog:

        def lowered(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)

        event.listen(catalog.engine, "connect", lowered)
        catalog.engine.dispose()
        with catalog.write() as conn:
            archive_id = add_archive(conn, "a")
        rows = [(archive_id, p, f"sample:{p}", None, p // 64, p % 64) for p in range(1000)]
        with catalog.write() as conn:
            assert insert_rows(conn, entries_table, ENTRY_COLUMNS, rows) == len(rows)
        with catalog.read() as conn:
            assert count(conn, entries_table) == len(rows)


def test_bulk_insert_compiles_once_for_every_sqlite_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog opened after another (each open makes an engine and a dialect) reuses the
    inserts `insert_rows` compiled for the first: a save into a newly opened pool compiled
    its seven again."""
    compiled: list[str] = []
    real = sqlite_dialect._compiled_insert.__wrapped__

    def counting(*args: Any) -> Any:
        compiled.append(args[0].name)
        return real(*args)

    cached = functools.lru_cache(maxsize=256)(counting)
    monkeypatch.setattr(sqlite_dialect, "_compiled_insert", cached)
    for name in ("one", "two"):
        with Catalog.open(sqlite_url(tmp_path / f"{name}.db")) as catalog:
            with catalog.write() as conn:
                archive_id = add_archive(conn, name)
                rows = [(archive_id, p, f"sample:{p}", None, 0, p) for p in range(3)]
                assert insert_rows(conn, entries_table, ENTRY_COLUMNS, rows) == 3
            with catalog.read() as conn:
                assert count(conn, entries_table) == 3
    assert "entries" in compiled
    assert len(compiled) == len(set(compiled)), compiled  # none compiled twice


@pytest.mark.parametrize(
    "value",
    [
        {"index": 3, "status": "completed", "reward": 0.5, "lengths": {"tokens": 7}},
        {"t": 'tab\t"quote"\\ \u00e9\ud800\n', "x": [None, True, -0.0, 1e308, 2**70]},
        [float("nan"), float("inf"), float("-inf")],
        "a str \u00e9",
        7,
        None,
    ],
)
def test_compact_json_is_json_dumps_without_blanks(value: Any) -> None:
    assert compact_json(value) == json.dumps(value, separators=(",", ":"))


def test_compact_json_refuses_what_json_dumps_refuses() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="Circular reference"):
        compact_json(cyclic)
    with pytest.raises(TypeError, match="not JSON serializable"):
        compact_json({"a": object()})


# --- network filesystem detection ---------------------------------------------------------

MOUNTINFO = r"""
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 27 0:27 / /scratch rw,relatime shared:5 - xfs /dev/nvme0n1 rw
31 27 0:28 / /tmp rw,nosuid - tmpfs tmpfs rw
32 27 0:29 / /var/lib/docker/overlay rw - overlay overlay rw,lowerdir=/a
40 27 0:40 / /mnt/nfs rw,relatime shared:7 master:1 - nfs4 server:/export rw,vers=4.2
41 40 0:41 / /mnt/nfs/local\040disk rw - ext4 /dev/sdb1 rw
42 27 0:42 / /mnt/smb rw - cifs //host/share rw
43 27 0:43 / /lustre rw - lustre 10.0.0.1@tcp:/fs rw
44 27 0:44 / /jfs rw - fuse.juicefs JuiceFS:vol rw
45 27 0:45 / /data rw - nfs server:/data rw
46 27 0:46 / /data2 rw - ext4 /dev/sdc rw
47 27 0:47 / /tmp rw - nfs server:/tmp rw
"""

PROC_MOUNTS = """
/dev/vda / ext4 rw,relatime 0 0
server:/home /home nfs rw,vers=3 0 0
//h/s /shares/team smb3 rw 0 0
/dev/sdb1 /home/local xfs rw 0 0
fuse-overlayfs /containers fuse.fuse-overlayfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", "ext4"),
        ("/work/pool", "ext4"),
        ("/scratch/pool", "xfs"),
        ("/var/lib/docker/overlay/x", "overlay"),
        ("/mnt/nfs/pool", "nfs4"),
        ("/mnt/nfs/local disk/pool", "ext4"),  # a local disk mounted inside an NFS tree
        ("/mnt/nfs/local disk2", "nfs4"),
        ("/mnt/smb/x", "cifs"),
        ("/lustre/project", "lustre"),
        ("/jfs/p", "fuse.juicefs"),
        ("/data", "nfs"),
        ("/data2/p", "ext4"),  # /data is not a prefix of /data2
        ("/tmp/p", "nfs"),  # over-mounted: the last mount on a point wins
    ],
)
def test_filesystem_type_from_mountinfo(path: str, expected: str) -> None:
    assert filesystem_type(path, MOUNTINFO) == expected


def test_filesystem_type_from_proc_mounts() -> None:
    assert filesystem_type("/home/alice", PROC_MOUNTS) == "nfs"
    assert filesystem_type("/home/local/pool", PROC_MOUNTS) == "xfs"
    assert filesystem_type("/shares/team/x", PROC_MOUNTS) == "smb3"
    assert filesystem_type("/srv", PROC_MOUNTS) == "ext4"
    assert filesystem_type("/x", "") is None


@pytest.mark.parametrize(
    "fstype",
    [
        *("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph"),
        *("glusterfs", "9p", "fuse.juicefs", "fuse.sshfs", "fuse.s3fs", "fuse", "NFS4"),
    ],
)
def test_network_filesystems_are_recognised(fstype: str) -> None:
    assert is_network_filesystem(fstype)


@pytest.mark.parametrize(
    "fstype", ["ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "fuse.fuse-overlayfs"]
)
def test_local_filesystems_pass(fstype: str) -> None:
    assert not is_network_filesystem(fstype)


def test_check_local_filesystem_message() -> None:
    check_local_filesystem("/scratch/pool", MOUNTINFO)
    check_local_filesystem("/mnt/nfs/local disk/pool", MOUNTINFO)
    with pytest.raises(UnsupportedFilesystemError) as info:
        check_local_filesystem("/mnt/nfs/pool", MOUNTINFO)
    message = str(info.value)
    assert "nfs4" in message and "locking" in message
    assert "postgresql+psycopg://" in message


def test_open_refuses_a_catalog_on_a_network_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = os.path.realpath(tmp_path)
    table = f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {folder} rw - fuse.juicefs jfs rw\n"
    monkeypatch.setattr(catalog_engine, "read_mount_table", lambda: table)
    with pytest.raises(UnsupportedFilesystemError, match=r"fuse\.juicefs"):
        Catalog.open(sqlite_url(tmp_path / "c.db"))
    assert list(tmp_path.iterdir()) == []  # nothing was created
    # The check can be skipped by a caller that knows better (e.g. a single-host 9p VM).
    Catalog.open(sqlite_url(tmp_path / "c.db"), check_filesystem=False).close()


def test_switching_a_new_file_to_wal_waits_for_a_busy_writer(tmp_path: Path) -> None:
    # SQLite answers BUSY at once (no busy handler) when a connection switches a file that
    # another connection is writing to WAL; two processes creating one pool hit exactly that.
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    released = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        holder.execute("COMMIT")
        released.set()

    threading.Thread(target=release_later).start()
    engine = make_engine(f"sqlite:///{path}", busy_timeout_ms=10_000)
    try:
        with engine.connect() as conn:
            assert released.is_set()
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()
        holder.close()
