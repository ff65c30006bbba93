"""The PostgreSQL catalog: writers serialised by one advisory lock, readers on snapshots.

PostgreSQL gets SQLite's semantics on purpose, so that the save and GC protocols' correctness
argument (docs/architecture/save-protocol.md and docs/architecture/gc-protocol.md) carries over word
for word: every write transaction first takes one transaction-scoped advisory lock
(`PG_WRITE_LOCK`), so writers take turns exactly as under ``BEGIN IMMEDIATE``, waiting up to the
busy timeout (``lock_timeout``); writers run at READ COMMITTED, so each statement after the lock
sees every commit made before it; readers get one REPEATABLE READ snapshot per transaction and never
wait for writers. As for SQLite, the driver's own BEGIN is off and the ``begin`` event sends ours
(with the lock: one round trip).

A process stopped inside a write transaction (Ctrl-Z, a suspended batch job, a debugger)
holds the write lock until it resumes. PostgreSQL bounds that: every write transaction sets
``idle_in_transaction_session_timeout`` (`idle_in_transaction_timeout_ms`: half the busy
timeout), so the server ends a session that sits idle inside one and other writers go on; the
stopped process finds its transaction gone when it resumes, and a save's lease fences out
the rest (docs/architecture/save-protocol.md, "Save protocol"). A transaction that unlinks blob
files under the lock calls `pin_write_lock` first, because other writers rely on those unlinks
happening while it holds the lock.

A reader's transactions are READ ONLY (docs/architecture/shared-pools.md, "Shared pools").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import Any

from sqlalchemy import JSON, Table, event, insert, text
from sqlalchemy.engine import URL, Connection, Engine, create_engine
from sqlalchemy.engine.interfaces import ExceptionContext
from sqlalchemy.exc import DBAPIError, NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry

from ...errors import (
    ArchiveError,
    CatalogError,
    CatalogLockedError,
    ReadOnlyPoolError,
    extra_hint,
)
from ..models import metadata
from ..urls import shown_url
from .base import (
    LAZY_COMMIT_OPTION,
    WRITE_OPTION,
    CatalogDialect,
    CatalogUnreachableError,
    compact_json,
    track_for_fork,
)

__all__ = [
    "PG_WRITE_LOCK",
    "POSTGRES_EXTRA_HINT",
    "PostgreSQLDialect",
    "idle_in_transaction_timeout_ms",
]

PG_WRITE_LOCK = 0x61726368_6D677231  # b"archmgr1": fixed, so every process agrees on it
"""The key of the advisory lock every PostgreSQL write transaction takes first: PostgreSQL's
``BEGIN IMMEDIATE``. Advisory locks are per database, so pools in different databases never
wait for each other."""

POSTGRES_EXTRA_HINT = extra_hint("postgres")


def _create_engine(url: URL, **kwargs: Any) -> Engine:
    try:
        return create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        extra = POSTGRES_EXTRA_HINT if url.get_backend_name() == "postgresql" else "install it"
        raise CatalogError(
            f"the catalog URL {shown_url(url)} needs the Python "
            f"module {exc.name!r}, which is not installed; {extra}"
        ) from exc
    except NoSuchModuleError as exc:
        raise CatalogError(
            f"the catalog URL {shown_url(url)} names a database or "
            f"driver SQLAlchemy does not know ({exc})"
        ) from exc


_PG_LOCK_NOT_AVAILABLE = "55P03"
_PG_NO_PRIVILEGE = "42501"
_PG_READ_ONLY_TRANSACTION = "25006"
_PG_SERIALIZATION_FAILURE = "40001"
_PG_DEADLOCK = "40P01"
_PG_BAD_AUTH = ("28000", "28P01")
_PG_NO_DATABASE = "3D000"
_PG_TOO_MANY_CONNECTIONS = "53300"
_PG_IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
# admin_shutdown (pg_ctl stop/restart, pg_terminate_backend), crash_shutdown (another backend
# crashed), cannot_connect_now (starting up or shutting down): the server comes back.
_PG_SERVER_GOING_AWAY = ("57P01", "57P02", "57P03")


def idle_in_transaction_timeout_ms(busy_timeout_ms: int) -> int:
    """How long a PostgreSQL write transaction may sit idle before the server ends it.

    Half the busy timeout, and at least a second. Half: a writer that starts waiting for the
    lock at the moment its holder stops gets it after at most this long, well inside its own
    busy timeout, instead of timing out together with the kill. At least a second: the
    library's write transactions go from statement to statement in milliseconds (those that
    do file I/O under the lock call `pin_write_lock`), so only a stopped (or wedged) process
    sits idle for that long, even with a tiny busy timeout. It does not depend on the lease:
    the server's rollback undoes everything of the cut transaction, and what the stopped
    process did before it is what its lease protects, which lapses on its own, as for any
    paused writer. The bound is the holder's: each process sets it from its own busy timeout.
    """
    return max(busy_timeout_ms // 2, 1000)


def _pg_reason(exc: BaseException) -> str:
    """The server's (or libpq's) message, on one line."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(exc)
    return " ".join(text.split())


def _translate_postgresql_error(
    exc: BaseException, where: str, busy_timeout_ms: int, *, read_only: bool = False
) -> ArchiveError | None:
    """The `CatalogError` a raw psycopg error stands for, or None to let it through."""
    try:
        import psycopg
    except ModuleNotFoundError:  # pragma: no cover - the engine could not exist without it
        return None
    if not isinstance(exc, psycopg.Error):
        return None
    state = getattr(exc, "sqlstate", None)
    reason = _pg_reason(exc)
    if state == _PG_READ_ONLY_TRANSACTION or (read_only and state == _PG_NO_PRIVILEGE):
        return ReadOnlyPoolError(
            f"the catalog {where} is open read-only here; nothing was written ({reason})"
        )
    if state == _PG_NO_PRIVILEGE:
        return ReadOnlyPoolError(
            f"the catalog {where} refused this role a write ({reason}); nothing was "
            "committed: a role that may only read opens the pool read-only, a writer role "
            "needs the GRANTs of the docs' 'Shared pools: readers and writers', and a "
            "catalog upgrade needs the catalog's owner ('archive-manager db upgrade' as it)"
        )
    if state == _PG_LOCK_NOT_AVAILABLE:
        return CatalogLockedError(
            f"the catalog {where} stayed locked by another process for longer than the busy "
            f"timeout ({busy_timeout_ms} ms); retry later, or find the process holding the "
            "write lock (pg_locks, locktype 'advisory', joined to pg_stat_activity) "
            f"({reason})"
        )
    if state == _PG_IDLE_IN_TRANSACTION_TIMEOUT:
        return CatalogUnreachableError(
            f"the catalog server of {where} ended this process's write transaction: it sat "
            "idle inside it for longer than "
            f"{idle_in_transaction_timeout_ms(busy_timeout_ms)} ms, as a process stopped by "
            "Ctrl-Z, a debugger or a suspended job does; nothing of it was committed, and "
            f"other writers went on meanwhile ({reason})"
        )
    if state in _PG_SERVER_GOING_AWAY:
        return CatalogUnreachableError(
            f"the catalog server of {where} went away (restarting or shutting down), rolling "
            f"back any transaction this process had open: {reason}"
        )
    if state in (_PG_SERIALIZATION_FAILURE, _PG_DEADLOCK):
        what = "a deadlock" if state == _PG_DEADLOCK else "a serialization failure"
        return CatalogError(
            f"the catalog {where} aborted a transaction with {what} ({reason}); archive_manager "
            "writers take one lock in turn and cannot cause this, so another program (or a "
            "catalog upgrade) is using the tables at the same time; nothing was committed, "
            "retry the operation"
        )
    if state is None and isinstance(exc, psycopg.OperationalError):
        # A failed connect carries no SQLSTATE, only libpq's text (and the server's FATAL).
        state = _connect_failure_state(reason)
        if state is None:
            # Refused, unknown host, timeout, or a connection lost mid-transaction.
            return CatalogUnreachableError(f"cannot reach the catalog server of {where}: {reason}")
    if state in _PG_BAD_AUTH:
        return CatalogError(f"the catalog server refused the login for {where}: {reason}")
    if state == _PG_NO_DATABASE:
        return CatalogError(
            f"the catalog database of {where} does not exist ({reason}); create it first "
            "(CREATE DATABASE ... OWNER ...)"
        )
    if state == _PG_TOO_MANY_CONNECTIONS:
        return CatalogError(f"the catalog server of {where} has no free connection: {reason}")
    return None


def _connect_failure_state(reason: str) -> str | None:
    """The SQLSTATE a connect failure's message stands for, or None (no server answered)."""
    if "FATAL" not in reason:
        return None
    if (
        "authentication failed" in reason
        or "no pg_hba.conf entry" in reason
        or ("role " in reason and "does not exist" in reason)
    ):
        return _PG_BAD_AUTH[1]
    if "database " in reason and "does not exist" in reason:
        return _PG_NO_DATABASE
    if "too many" in reason and "connections" in reason:
        return _PG_TOO_MANY_CONNECTIONS
    return None


def _make_postgresql_engine(url: URL, timeout_ms: int, read_only: bool) -> Engine:
    if url.drivername == "postgresql":
        # SQLAlchemy's default driver is psycopg2; the one this library supports is psycopg 3.
        url = url.set(drivername="postgresql+psycopg")
    where = shown_url(url)
    connect_args: dict[str, Any] = {}
    if "application_name" not in url.query:
        # Shown in pg_stat_activity, so an operator can tell who holds the write lock.
        connect_args["application_name"] = "archive_manager"
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = max(1, min(30, -(-timeout_ms // 1000)))
    engine = _create_engine(
        url,
        pool_pre_ping=True,
        # The driver's own BEGIN is turned off (its "autocommit"): the begin event below sends
        # BEGIN together with the write lock, one round trip, as pysqlite's recipe does for
        # SQLite. psycopg's commit() and rollback() still end the transaction we began.
        isolation_level="AUTOCOMMIT",
        pool_size=5,
        max_overflow=20,
        connect_args=connect_args,
        json_serializer=compact_json,
    )
    # NOTE: writers must stay at READ COMMITTED: at REPEATABLE READ the snapshot would be taken
    # by the statement that waits for the write lock, i.e. before the previous writer
    # committed, and the protocols' read-then-write steps would act on stale rows. Readers
    # get one snapshot for their whole transaction. SET LOCAL bounds only this transaction's
    # idleness (see `idle_in_transaction_timeout_ms`): readers, which block no writer, may
    # hold a snapshot open across the caller's work.
    write_begin = (
        "BEGIN ISOLATION LEVEL READ COMMITTED; "
        "SET LOCAL idle_in_transaction_session_timeout = "
        f"{idle_in_transaction_timeout_ms(timeout_ms):d}; "
        f"SELECT pg_advisory_xact_lock({PG_WRITE_LOCK:d})"
    )
    # A reader's transactions are READ ONLY as well: the server itself refuses any write that
    # got past `Catalog.write`'s gate (docs/architecture/shared-pools.md, "Shared pools").
    read_begin = "BEGIN ISOLATION LEVEL REPEATABLE READ" + (" READ ONLY" if read_only else "")
    no_parameters = {"no_parameters": True}  # several statements: the simple query protocol

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # The busy timeout bounds every lock wait of this session: the write lock, and row or
        # table locks held by a foreign program or a migration.
        with dbapi_connection.cursor() as cursor:
            # NOTE: 0 means "wait forever" to PostgreSQL but "never wait" to SQLite.
            cursor.execute(f"SET lock_timeout = {max(timeout_ms, 1):d}")
        dbapi_connection.commit()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        write = options.get(WRITE_OPTION)
        conn.exec_driver_sql(write_begin if write else read_begin, execution_options=no_parameters)
        if write and options.get(LAZY_COMMIT_OPTION):
            # LOCAL: this transaction's commit only; the next durable commit flushes the WAL
            # past it.
            conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        if context.is_pre_ping:
            return  # a stale pooled connection: the pool reconnects by itself
        translated = _translate_postgresql_error(
            context.original_exception, where, timeout_ms, read_only=read_only
        )
        if translated is not None:
            raise translated from context.original_exception

    track_for_fork(engine)
    return engine


_COPY_MIN_ROWS = 512


def _copy_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterator[Sequence[Any]]
) -> int:
    """``COPY ... FROM STDIN`` in the open transaction.

    NOTE: measured, 100k entry rows take 0.68 s instead of 1.1 s with Core's batched
    INSERT ... VALUES; below `_COPY_MIN_ROWS` rows the INSERT wins, being one round trip
    where COPY needs two (and a save holds the write lock meanwhile).
    """
    import psycopg

    dialect = conn.dialect
    serialize = getattr(dialect, "_json_serializer", None) or compact_json
    json_columns = [i for i, name in enumerate(columns) if isinstance(table.c[name].type, JSON)]
    preparer = dialect.identifier_preparer
    sql = (
        f"COPY {preparer.format_table(table)} "
        f"({', '.join(preparer.quote(name) for name in columns)}) FROM STDIN"
    )
    raw = conn.connection.dbapi_connection
    total = 0
    try:
        with raw.cursor() as cursor, cursor.copy(sql) as copy:  # type: ignore[union-attr]
            for row in rows:
                if json_columns:
                    row = list(row)
                    for i in json_columns:
                        if row[i] is not None:
                            row[i] = serialize(row[i])
                copy.write_row(row)
                total += 1
    except psycopg.Error as exc:
        # The same exception classes as every other statement (IntegrityError, ...).
        raise DBAPIError.instance(sql, None, exc, psycopg.Error) from exc
    return total


def _server_unwritable(engine: Engine) -> str | None:
    """Why this session may not write the catalog (None: it may, or its tables do not exist
    yet and will be created by this open).

    NOTE: a role with every privilege still writes nothing on a hot standby (a read replica)
    or where ``default_transaction_read_only`` is on for the database or the role: every
    write fails with 25006.  This engine's BEGINs name an isolation level, never READ WRITE
    (an operator's read-only setting is never overridden), so they inherit that default, and
    ``transaction_read_only`` inside one tells both.
    """
    names = sorted(metadata.tables)
    with engine.connect() as conn, conn.begin():
        allowed, found, standby, read_only = conn.execute(
            text(
                # NOTE: one privilege per call: with several listed, PostgreSQL answers
                # whether *any* of them is held.
                "SELECT bool_and(has_table_privilege(c.oid, 'INSERT') "
                "AND has_table_privilege(c.oid, 'UPDATE') "
                "AND has_table_privilege(c.oid, 'DELETE')), count(*), "
                "pg_is_in_recovery(), current_setting('transaction_read_only') = 'on' "
                "FROM pg_class c WHERE c.relkind = 'r' AND c.relname = ANY(:names) "
                "AND pg_table_is_visible(c.oid)"
            ),
            {"names": names},
        ).one()
    if standby:
        return "the catalog server is a standby in recovery (a read replica): it takes no writes"
    if read_only:
        return (
            "the catalog database or role is set read-only (default_transaction_read_only): "
            "the server takes no writes"
        )
    if not found or allowed:
        return None
    return "the catalog role may not write the catalog's tables (INSERT, UPDATE and DELETE)"


class PostgreSQLDialect(CatalogDialect):
    """The PostgreSQL catalog (see the module docstring)."""

    name = "postgresql"
    write_lock = "an advisory write lock"

    def make_engine(self, url: URL, busy_timeout_ms: int, *, read_only: bool) -> Engine:
        return _make_postgresql_engine(url, busy_timeout_ms, read_only)

    def translate_error(
        self, exc: BaseException, where: str, busy_timeout_ms: int, *, read_only: bool = False
    ) -> ArchiveError | None:
        return _translate_postgresql_error(exc, where, busy_timeout_ms, read_only=read_only)

    def server_unwritable_reason(self, engine: Engine) -> str | None:
        return _server_unwritable(engine)

    def pin_write_lock(self, conn: Connection) -> None:
        # Lifts `idle_in_transaction_timeout_ms` for the rest of this transaction; if the
        # server already ended the session, this fails and the caller unlinks nothing.
        conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")

    def bulk_insert(
        self,
        conn: Connection,
        table: Table,
        columns: Sequence[str],
        rows: Iterator[Sequence[Any]],
        batch_size: int,
    ) -> int:
        if conn.dialect.driver == "psycopg":
            first = list(islice(rows, _COPY_MIN_ROWS))
            if len(first) == _COPY_MIN_ROWS:
                return _copy_rows(conn, table, columns, chain(first, rows))
            if first:
                # NOTE: one multi-row INSERT, not the driver's executemany: psycopg runs that
                # in pipeline mode, after which the server left a writer stopped at its next
                # step (SIGSTOP, Ctrl-Z) "idle in transaction" without ending it at the
                # idle_in_transaction_session_timeout this transaction set, so the stopped
                # writer held the write lock for good (tests/pool/test_stopped_writer.py, 2 runs
                # in 4 before).
                conn.execute(
                    insert(table).values([dict(zip(columns, row, strict=True)) for row in first])
                )
            return len(first)
        return super().bulk_insert(conn, table, columns, rows, batch_size)
