"""The SQLite catalog: a local file in WAL mode, writers serialised by ``BEGIN IMMEDIATE``.

SQLite follows SQLAlchemy's recipe for taking over transaction control from the sqlite3
driver (``isolation_level = None`` on connect, our own ``BEGIN`` from the ``begin`` event),
so that every transaction, reads included, is a real SQLite transaction and writers take the
write lock up front with ``BEGIN IMMEDIATE``: a second writer then waits in the busy handler
instead of failing mid-transaction with an unretryable ``SQLITE_BUSY_SNAPSHOT``.

SQLite cannot take the write lock from a process stopped inside a write transaction: when the
busy timeout runs out, `CatalogLockedError` names the processes holding the lock
(`sqlite_lock_holders`, from ``/proc/locks``).

A reader's engine (``read_only=True``) never writes: it opens the file ``mode=ro`` or
``immutable=1`` as `sqlite_read_mode` decides, without the WAL switch or any pragma that
writes, and refuses a write transaction at BEGIN (docs/architecture/shared-pools.md, "Shared
pools").
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Table, event, insert
from sqlalchemy.engine import URL, Connection, Dialect, Engine, create_engine
from sqlalchemy.engine.interfaces import ExceptionContext
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from ..._util.sqlite_read import (
    ReaderConnection,
    begin_read_snapshot,
    connect_reader,
    file_stamp,
    reader_uri,
    sqlite_read_mode,
)
from ...errors import ArchiveError, CatalogError, CatalogLockedError, ReadOnlyPoolError
from ..urls import sqlite_path
from .base import LAZY_COMMIT_OPTION, WRITE_OPTION, CatalogDialect, compact_json, track_for_fork

__all__ = [
    "LockHolder",
    "SQLiteDialect",
    "begin_read_snapshot",
    "check_journal_mode",
    "check_read_unchanged",
    "connect_reader",
    "parse_lock_table",
    "reader_uri",
    "sqlite_lock_holders",
    "sqlite_locked_message",
    "sqlite_read_mode",
]

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_CORRUPT_MESSAGES = ("file is not a database", "database disk image is malformed")

# --- who holds a SQLite catalog's write lock: a pure parser plus a thin reader ------------

# NOTE: SQLite's unix VFS keeps a WAL database's write lock as an fcntl (POSIX) lock on one
# byte of the -shm file, byte 120 (UNIX_SHM_BASE + WAL_WRITE_LOCK), held exclusively from
# BEGIN IMMEDIATE to the end of the transaction. A database a foreign program took out of WAL
# mode is locked through the database file itself: any exclusive lock on it counts.
_SHM_WRITE_LOCK_BYTE = 120
_STOPPED_STATES = ("T", "t")  # stopped by a signal (Ctrl-Z, SIGSTOP) or by a tracer
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_COMMAND_SHOWN = 200


@dataclass(frozen=True)
class LockHolder:
    """A process that holds a SQLite catalog's write lock, as ``/proc`` tells it."""

    pid: int
    command: str | None
    """Its command line (passwords in URLs masked, cut short), None when unreadable."""
    stopped: bool
    """True when a signal or a debugger stopped it: it holds the lock until it resumes."""


def parse_lock_table(
    lock_table: str, shm: tuple[int, int, int] | None, database: tuple[int, int, int] | None
) -> list[int]:
    """The pids holding a SQLite catalog's write lock, from the text of ``/proc/locks``.

    Args:
        lock_table: The text of ``/proc/locks``: per line ``N: POSIX ADVISORY WRITE pid
            major:minor:inode start end``, with the device numbers in hex; waiting requests
            (``N: -> ...``) hold nothing and are skipped.
        shm: (major, minor, inode) of the catalog's ``-shm`` file, None if it has none.
        database: (major, minor, inode) of the catalog file.

    Returns:
        Each pid once, in the order listed, that holds an exclusive POSIX lock covering the
        WAL write-lock byte of ``shm`` or any part of ``database``.
    """
    pids: list[int] = []
    for line in lock_table.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX" or fields[3] != "WRITE":  # "->": waiting
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
            start = int(fields[6])
            end = None if fields[7] == "EOF" else int(fields[7])
        except ValueError:
            continue
        covers_write_byte = start <= _SHM_WRITE_LOCK_BYTE and (
            end is None or end >= _SHM_WRITE_LOCK_BYTE
        )
        holds = (where == shm and covers_write_byte) or where == database
        if pid > 0 and holds and pid not in pids:
            pids.append(pid)
    return pids


def _file_id(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def _describe_process(pid: int) -> LockHolder:
    command: str | None = None
    stopped = False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        # One line whatever the arguments hold (a ``python -c`` script has newlines).
        text = " ".join(raw.replace(b"\0", b" ").decode("utf-8", "replace").split())
        if text:
            text = _URL_PASSWORD.sub(r"\1***@", text)
            command = text if len(text) <= _COMMAND_SHOWN else text[: _COMMAND_SHOWN - 3] + "..."
    except OSError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        # "pid (comm) state ...": comm may hold spaces and parentheses, so split after it.
        state = stat.rpartition(")")[2].split()[:1]
        stopped = bool(state) and state[0] in _STOPPED_STATES
    except OSError:
        pass
    return LockHolder(pid, command, stopped)


def sqlite_lock_holders(database: str | os.PathLike[str]) -> list[LockHolder] | None:
    """The processes holding the write lock of the SQLite catalog file ``database``.

    Returns:
        The holders (usually one), an empty list when ``/proc/locks`` names none (the lock
        was just released, or its holder lives in another pid namespace), or None where
        there is no ``/proc/locks`` to read (not Linux).
    """
    try:
        lock_table = Path("/proc/locks").read_text(errors="replace")
    except OSError:
        return None
    path = os.fspath(database)
    pids = parse_lock_table(lock_table, _file_id(f"{path}-shm"), _file_id(path))
    return [_describe_process(pid) for pid in pids]


def _describe_holder(holder: LockHolder) -> str:
    facts = []
    if holder.pid == os.getpid():
        facts.append("this process: another of its connections")
    if holder.stopped:
        facts.append("stopped")
    if holder.command:
        facts.append(holder.command)
    return f"pid {holder.pid}" + (f" ({'; '.join(facts)})" if facts else "")


def sqlite_locked_message(
    database: str, busy_timeout_ms: int, reason: str, holders: Sequence[LockHolder] | None
) -> str:
    """The text of the `CatalogLockedError` for a SQLite catalog whose busy timeout ran out.

    It names who holds the write lock when ``holders`` does, and else says how to find out.
    """
    head = (
        f"the catalog {database} stayed locked for longer than the busy timeout "
        f"({busy_timeout_ms} ms): "
    )
    if not holders:
        return head + (
            f"another process holds its write lock; find it with 'fuser -v {database}-shm' or "
            f"'lsof {database}-shm' (a stopped process, state T in ps, holds it until it "
            f"resumes or ends); retry later ({reason})"
        )
    named = ", ".join(_describe_holder(h) for h in holders)
    stopped = [h.pid for h in holders if h.stopped]
    if stopped:
        advice = (
            "a stopped process (Ctrl-Z, a suspended job, a debugger) holds it until it resumes "
            f"(kill -CONT {' '.join(map(str, stopped))}) or ends"
        )
    else:
        advice = "wait for it to finish, or end it"
    return head + f"its write lock is held by {named}; {advice}, then retry ({reason})"


def check_journal_mode(row: tuple[Any, ...] | None, database: str) -> None:
    """Raise `CatalogError` unless SQLite answered ``PRAGMA journal_mode = WAL`` with ``wal``.

    SQLite does not fail when it cannot switch modes (read-only media, no shared memory): it
    silently answers with the mode it kept, so the answer must be checked.
    """
    mode = None if not row else str(row[0]).lower()
    if mode != "wal":
        raise CatalogError(
            f"SQLite refused WAL journal mode for the catalog {database} (it kept {mode!r}); "
            "the catalog needs WAL so that readers and writers in several processes do not "
            "block each other"
        )


def _set_wal(cursor: Any, timeout_ms: int) -> tuple[Any, ...] | None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    NOTE: switching a new file to WAL needs an exclusive lock, and SQLite answers BUSY at once
    instead of calling the busy handler; two processes creating one pool at the same moment
    hit that (seen: a save racing another's first open).  WAL persists in the file, so only a
    new catalog ever gets here with contention.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    delay = 0.002
    while True:
        try:
            row: tuple[Any, ...] | None = cursor.execute("PRAGMA journal_mode = WAL").fetchone()
            return row
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def _error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _file_size_limit_hint(database: str) -> str:
    """Why a write may have failed, where this process's file size limit (``ulimit -f``) is
    what stopped one of the catalog's files: SQLite reports EFBIG as a bare I/O error."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return ""
    for end in ("", "-wal", "-journal"):
        with contextlib.suppress(OSError):
            if os.path.getsize(database + end) + 65536 >= limit:
                return f" (the file size limit, EFBIG: ulimit -f allows {limit} bytes)"
    return ""


def _translate_sqlite_error(
    exc: BaseException, database: str, busy_timeout_ms: int, *, read_only: bool = False
) -> ArchiveError | None:
    """The `CatalogError` a raw sqlite3 error stands for, or None to let it through."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code, message = _error_code(exc), str(exc)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or (code is None and "database is locked" in message):
        # Looked up now, while the holder still holds the lock: the usual holder is a process
        # stopped inside a write transaction, and only a name tells the operator which.
        holders = sqlite_lock_holders(database)
        return CatalogLockedError(
            sqlite_locked_message(database, busy_timeout_ms, message, holders)
        )
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or any(m in message for m in _CORRUPT_MESSAGES):
        return CatalogError(
            f"the catalog file {database} is not a usable SQLite database ({message}): it is "
            "truncated or corrupt; restore it from a backup or rebuild it from the manifests"
        )
    if code == _SQLITE_FULL or "database or disk is full" in message:
        return CatalogError(
            f"the catalog file {database} cannot grow: the disk (or a quota) is full "
            f"({message}); nothing was committed, free some space and retry"
        )
    if code == _SQLITE_IOERR or "disk I/O error" in message:
        return CatalogError(
            f"the catalog file {database} could not be read or written: {message}"
            f"{_file_size_limit_hint(database)}; this transaction was not committed (check "
            "the disk and its free space)"
        )
    if read_only and (code == _SQLITE_READONLY or "readonly database" in message):
        return ReadOnlyPoolError(
            f"the catalog {database} is open read-only here; nothing was written ({message})"
        )
    if code == _SQLITE_READONLY or "readonly database" in message:
        return CatalogError(
            f"the catalog file {database} is read-only ({message}); the catalog needs write "
            "access to the file and its folder (for the -wal and -shm files), even to read"
        )
    if code == _SQLITE_CANTOPEN or "unable to open database file" in message:
        return CatalogError(f"cannot open the catalog file {database} ({message})")
    return None


def _make_sqlite_engine(url: URL, timeout_ms: int, read_only: bool) -> Engine:
    path = sqlite_path(url)
    if path is None:
        raise CatalogError(
            "an in-memory SQLite catalog is not supported: every connection would see its own "
            "empty database; give a file (sqlite:///path/to/catalog.db)"
        )
    database = str(path)
    if read_only:
        return _make_sqlite_reader(url, path, timeout_ms)

    # NOTE: QueuePool keeps connection set-up out of every transaction, and a save opens
    # several: measured, a read transaction takes 43 us pooled vs 300 us with NullPool, a
    # write 0.22 ms vs 1.4 ms. Processes never share it: forked children drop it (`track_for_fork`).
    engine = create_engine(
        url,
        poolclass=QueuePool,
        pool_size=5,
        max_overflow=64,
        connect_args={"timeout": timeout_ms / 1000.0},
        json_serializer=compact_json,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        # Take BEGIN/COMMIT away from the sqlite3 driver; the "begin" event emits our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {timeout_ms:d}")
            check_journal_mode(_set_wal(cursor, timeout_ms), database)
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        except BaseException as exc:
            cursor.close()
            # The pool forgets a connection whose set-up failed; release its file handle now.
            dbapi_connection.close()
            translated = _translate_sqlite_error(exc, database, timeout_ms)
            if translated is None:
                raise
            raise translated from exc
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        # NOTE: SQLite refuses to change the level inside a transaction, so it is set before
        # BEGIN, and set back at the next BEGIN of the connection (read or write), so a lazy
        # commit never leaks into another transaction of the pooled connection.
        lazy = bool(options.get(WRITE_OPTION) and options.get(LAZY_COMMIT_OPTION))
        info = conn.connection.info
        if info.get(LAZY_COMMIT_OPTION, False) != lazy:
            conn.exec_driver_sql(f"PRAGMA synchronous = {'NORMAL' if lazy else 'FULL'}")
            info[LAZY_COMMIT_OPTION] = lazy
        if options.get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        translated = _translate_sqlite_error(context.original_exception, database, timeout_ms)
        if translated is not None:
            raise translated from context.original_exception

    track_for_fork(engine)
    return engine


# --- SQLite readers that write nothing -----------------------------------------------------


def check_read_unchanged(conn: Connection) -> None:
    """At the end of a read transaction: refuse what an ``immutable`` connection read if the
    catalog file changed meanwhile (a writer opened the catalog and checkpointed into it).

    NOTE: SQLite trusts an immutable file not to change and keeps its pages cached across
    transactions; a changed file could give rows that mix two states.  An unchanged file
    (inode, size, mtime, ctime) proves the pages read were one state, however stale.

    Raises:
        CatalogError: the file changed; the connection is dropped, so a retry reads anew (and
            through the writer's WAL, see `sqlite_read_mode`).
    """
    try:
        raw = conn.connection.dbapi_connection
    except Exception:  # an invalidated connection: nothing was read through it
        return
    if not isinstance(raw, ReaderConnection) or raw.read_mode != "immutable":
        return
    if file_stamp(raw.database) == raw.stamp:
        return
    conn.invalidate()
    raise CatalogError(
        f"the catalog {raw.database} changed while this process read it (it was read as an "
        "unchanging file because no process had it open; a writer opened it meanwhile): "
        "what was read cannot be trusted; retry, and the read follows the writer's log"
    )


def _make_sqlite_reader(url: URL, path: Path, timeout_ms: int) -> Engine:
    """The engine of a reader that writes nothing: no WAL switch, no side files, no lock
    taken for writing (see `sqlite_read_mode`)."""
    database = str(path.absolute())

    def connect() -> sqlite3.Connection:
        try:
            return connect_reader(database, timeout_ms)
        except sqlite3.Error as exc:
            translated = _translate_sqlite_error(exc, database, timeout_ms, read_only=True)
            if translated is None:
                raise
            raise translated from exc

    engine = create_engine(
        url,
        creator=connect,
        poolclass=QueuePool,
        pool_size=5,
        max_overflow=64,
        json_serializer=compact_json,
    )

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        # A pooled connection opened in the other mode, or an immutable one whose file changed
        # since (its page cache is stale), is replaced by a new one.
        if not isinstance(dbapi_connection, ReaderConnection):
            return
        try:
            mode = sqlite_read_mode(database)
        except CatalogError:
            raise DisconnectionError() from None  # the new connection reports it
        stale = dbapi_connection.read_mode == "immutable" and (
            file_stamp(database) != dbapi_connection.stamp
        )
        if mode != dbapi_connection.read_mode or stale:
            raise DisconnectionError()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            raise ReadOnlyPoolError(f"the catalog {database} is open read-only here")
        try:
            # `connect` above is this engine's only creator: a sqlite3 connection.
            raw = cast(sqlite3.Connection, conn.connection.dbapi_connection)
            begin_read_snapshot(raw, database, timeout_ms)
        except sqlite3.Error as exc:
            # Raised from the begin event, which SQLAlchemy's handle_error does not see.
            translated = _translate_sqlite_error(exc, database, timeout_ms, read_only=True)
            if translated is None:
                raise
            raise translated from exc

    @event.listens_for(engine, "handle_error")
    def _on_error(context: ExceptionContext) -> None:
        translated = _translate_sqlite_error(
            context.original_exception, database, timeout_ms, read_only=True
        )
        if translated is not None:
            raise translated from context.original_exception

    track_for_fork(engine)
    return engine


def _sqlite_unwritable(url: URL) -> str | None:
    """Why this process cannot write the SQLite catalog at ``url`` (None: it can).  Writing
    needs the file and its folder (for ``-wal``/``-shm``)."""
    path = sqlite_path(url)
    if path is None:
        return None
    folder = path.absolute().parent
    # NOTE: access(2) also answers EROFS for a read-only mount, which is what stops root.
    if path.exists() and not os.access(path, os.W_OK):
        return f"this process may not write the catalog file {path}"
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        return f"this process may not write the catalog's folder {folder}"
    return None


def _arranged(
    row: Sequence[Any],
    order: list[int],
    processors: Sequence[Callable[[Any], Any] | None],
) -> tuple[Any, ...]:
    return tuple(
        value if processor is None else processor(value)
        for value, processor in zip((row[i] for i in order), processors, strict=True)
    )


class SQLiteDialect(CatalogDialect):
    """The SQLite catalog (see the module docstring)."""

    name = "sqlite"
    write_lock = "BEGIN IMMEDIATE, WAL"

    def make_engine(self, url: URL, busy_timeout_ms: int, *, read_only: bool) -> Engine:
        return _make_sqlite_engine(url, busy_timeout_ms, read_only)

    def translate_error(
        self, exc: BaseException, where: str, busy_timeout_ms: int, *, read_only: bool = False
    ) -> ArchiveError | None:
        return _translate_sqlite_error(exc, where, busy_timeout_ms, read_only=read_only)

    def catalog_file(self, url: URL) -> Path | None:
        return sqlite_path(url)

    def unwritable_reason(self, url: URL) -> str | None:
        return _sqlite_unwritable(url)

    def check_read_unchanged(self, conn: Connection) -> None:
        check_read_unchanged(conn)

    def bulk_insert(
        self,
        conn: Connection,
        table: Table,
        columns: Sequence[str],
        rows: Iterator[Sequence[Any]],
        batch_size: int,
    ) -> int:
        # NOTE: tuples straight to the driver (measured: 100k entry rows in 0.27 s instead
        # of 0.38 s), as SQLAlchemy then builds no per-row parameter dict; and many rows a
        # statement (`_VALUES_ROWS`): the driver lets go of the GIL at every step of a
        # statement, and a background save (`save_async`) then waited the 5 ms switch
        # interval for it back at each row behind a busy training loop: 2,048 rows of a
        # 1024-sample save took 11 s there (docs/architecture/save-protocol.md, "Handing
        # the GIL over").
        sql, order, processors, plain = _compiled_insert(
            table, tuple(columns), _same_statements(conn.dialect)
        )
        per = _values_rows(sql, len(columns), _parameter_limit(conn))
        total = 0
        while batch := list(islice(rows, batch_size)):
            if not plain:
                batch = [_arranged(row, order, processors) for row in batch]
            total += len(batch)
            if per == 1 or (plain and not _tuples_of(batch, len(columns))):
                # One row a step, where the driver checks each row's type and length: rows
                # run together into one statement's values would shift a short or long
                # row's values into its neighbours' columns (or bind a dict's keys).
                conn.exec_driver_sql(sql, batch)
                continue
            whole = len(batch) - len(batch) % per
            if whole:
                conn.exec_driver_sql(
                    _values_statement(sql, per),
                    [tuple(chain.from_iterable(batch[i : i + per])) for i in range(0, whole, per)],
                )
            if whole < len(batch):
                rest = batch[whole:]
                conn.exec_driver_sql(
                    _values_statement(sql, len(rest)), tuple(chain.from_iterable(rest))
                )
        return total


# The most rows one `bulk_insert` statement carries: one step of the driver for them all.
_VALUES_ROWS = 256
# SQLite's limit on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER) unless the library
# was built with another: 32766 since 3.32.0, 999 before.
_MAX_PARAMETERS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


def _tuples_of(rows: list[Any], n: int) -> bool:
    """Whether every row is a tuple of ``n`` values (the driver's checks, at C speed)."""
    return all(map(isinstance, rows, repeat(tuple))) and set(map(len, rows)) == {n}


def _parameter_limit(conn: Connection) -> int:
    """The most parameters a statement may have on ``conn``: `_MAX_PARAMETERS`, or less where
    the library says so (`sqlite3.Connection.getlimit`, Python 3.11+: a library built with a
    smaller SQLITE_MAX_VARIABLE_NUMBER, or a connection that lowered it)."""
    getlimit = getattr(conn.connection.dbapi_connection, "getlimit", None)
    if getlimit is None:
        return _MAX_PARAMETERS
    return min(_MAX_PARAMETERS, int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)))


def _values_rows(sql: str, columns: int, max_parameters: int) -> int:
    """How many rows of ``columns`` values one statement of `bulk_insert` carries within
    ``max_parameters``: 1 when ``sql`` is not the single-row ``... VALUES (?, ...)`` form
    `_values_statement` extends."""
    if columns < 1 or not sql.endswith(" VALUES (" + ", ".join("?" * columns) + ")"):
        return 1
    return max(1, min(_VALUES_ROWS, max_parameters // columns))


@functools.lru_cache(maxsize=64)
def _values_statement(sql: str, rows: int) -> str:
    """``sql`` (``INSERT ... VALUES (?, ...)``) inserting ``rows`` rows at once."""
    values = sql[sql.rindex(" VALUES (") + len(" VALUES ") :]
    return sql + (", " + values) * (rows - 1)


# The first dialect seen of each kind (see `_same_statements`).
_DIALECTS: dict[tuple[Any, ...], Dialect] = {}


def _same_statements(dialect: Dialect) -> Dialect:
    """The first dialect seen that compiles `bulk_insert`'s statements and binds their
    values as ``dialect`` does: its class, parameter style and JSON serializer (every engine
    `_make_sqlite_engine` makes has the same).

    NOTE: the compiled inserts are cached per dialect object, and every open of a pool makes
    an engine, hence a dialect: the first save into a newly opened pool compiled its seven
    inserts again (~0.7 ms each; `tools/bench.py` opens a pool per round).
    """
    key = (type(dialect), dialect.paramstyle, getattr(dialect, "_json_serializer", None))
    return _DIALECTS.setdefault(key, dialect)


@functools.lru_cache(maxsize=256)
def _compiled_insert(
    table: Table, columns: tuple[str, ...], dialect: Dialect
) -> tuple[str, list[int], list[Any], bool]:
    """`bulk_insert`'s statement for these columns, compiled once per dialect.

    NOTE: compiling it each time cost a small save ~4 ms of its CPU (seven inserts a save;
    docs/performance.md, "Small saves").
    """
    compiled = insert(table).compile(dialect=dialect, column_keys=list(columns))
    # The compiled statement lists columns in table order; map each row onto it.
    order = [columns.index(key) for key in compiled.positiontup or ()]
    processors = [
        table.c[columns[i]].type.dialect_impl(dialect).bind_processor(dialect) for i in order
    ]
    plain = order == list(range(len(columns))) and not any(processors)
    return str(compiled), order, processors, plain
