"""How a process that must write nothing opens a SQLite catalog file
(docs/architecture/shared-pools.md, "Shared pools"): which read mode (`sqlite_read_mode`), the URI
(`reader_uri`), the connection (`connect_reader`) and its read transaction (`begin_read_snapshot`).

Standard library only: the catalog's SQLite dialect reads through these, and so do the
CLI's archive-name completion and the SQLite listing (`pool/sqlite_listing.py`), which must not
import SQLAlchemy (docs/architecture/start-up.md, "Start-up").
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from ..errors import CatalogError

__all__ = [
    "ReaderConnection",
    "begin_read_snapshot",
    "connect_reader",
    "file_stamp",
    "reader_uri",
    "sqlite_read_mode",
]

# Bytes of a WAL file's header: a shorter -wal holds no commit (docs/architecture/shared-pools.md,
# "Shared pools").
_WAL_HEADER = 32


def sqlite_read_mode(path: str | os.PathLike[str]) -> str:
    """How a reader that must write nothing opens the SQLite catalog ``path``: ``"ro"`` or
    ``"immutable"`` (docs/architecture/shared-pools.md, "Shared pools").

    NOTE: SQLite reads a WAL database it may not write only if its ``-wal`` and ``-shm``
    files already exist, or as ``immutable`` (https://www.sqlite.org/wal.html#readonly,
    https://www.sqlite.org/walformat.html); a plain ``mode=ro`` open of a WAL file without
    them fails ("unable to open database file") where they cannot be created, and creates
    them where they can.  So:

    * both exist: a process has the catalog open (or died with it open).  ``mode=ro`` with
      a read-only ``-shm`` (`reader_uri`) reads through them under the writers' locks, or,
      when the process that wrote them died, through a wal-index rebuilt in its own memory:
      each read transaction is a consistent snapshot of the last commit before it began, as
      for any WAL reader, and neither file is written.
    * no ``-wal`` (or an empty one, which holds no commit): no process has the catalog open
      and the file holds every commit.  ``immutable=1`` reads it with no lock and no side
      file; since SQLite then assumes nobody changes it, `check_read_unchanged` watches the
      file for a writer that opens it meanwhile.

    Raises:
        CatalogError: a ``-wal`` that holds commits but no ``-shm`` (a writer died in a state
            only a writable open recovers): reading the file alone could return half a
            checkpoint.
    """
    # SQLite puts -wal and -shm beside the file a symlink names: look there.
    database = os.path.realpath(os.fspath(path))
    try:
        wal_size = os.stat(f"{database}-wal").st_size
    except FileNotFoundError:
        return "immutable"
    if os.path.exists(f"{database}-shm"):
        return "ro"
    if wal_size < _WAL_HEADER:
        return "immutable"
    raise CatalogError(
        f"the catalog {database} has a write-ahead log ({database}-wal) but no -shm file: a "
        "process that wrote it died, and only a process that may write the pool can recover "
        "it; open the pool once with write access (any read verb does), then read it here"
    )


def reader_uri(database: str | os.PathLike[str], mode: str) -> str:
    """The URI a reader that writes nothing opens ``database`` with, in ``mode`` as
    `sqlite_read_mode` answered it.

    NOTE: ``mode=ro`` alone still opens ``-shm`` read-write: a reader that finds no live
    process on it (a writer died, its ``-wal`` and ``-shm`` left behind) truncates and rebuilds
    the wal-index there, and every reader writes its read marks into it.  ``readonly_shm=1``
    opens ``-shm`` read-only (SQLite 3.22 and later, https://www.sqlite.org/wal.html#readonly):
    beside a live writer SQLite reads the writer's wal-index under its locks, and with none it
    builds the index of the ``-wal`` in heap memory; the pool's files stay byte-identical
    (tests/pool/test_shared_pools.py reads a crashed writer's pool so).
    """
    query = "mode=ro&readonly_shm=1" if mode == "ro" else "immutable=1"
    return f"{Path(database).absolute().as_uri()}?{query}"


_SQLITE_READONLY = 8
_SQLITE_CANTOPEN = 14
# Extended result codes of a read-only wal-index that could not be used at this moment.
_SQLITE_READONLY_RECOVERY = _SQLITE_READONLY | (1 << 8)
_SQLITE_READONLY_CANTINIT = _SQLITE_READONLY | (5 << 8)


def begin_read_snapshot(raw: sqlite3.Connection, database: str, timeout_ms: int) -> None:
    """Begin a read transaction on a reader's connection (`reader_uri`) and take its snapshot
    now, before the caller reads anything.

    NOTE: a reader whose ``-shm`` is read-only cannot fix the wal-index up itself: when it
    starts a read while a live writer is rewriting the index header or restarting the log,
    SQLite answers ``SQLITE_READONLY_RECOVERY`` or ``SQLITE_READONLY_CANTINIT`` where a
    writable reader would have retried (measured: about 1 read in 30,000 beside a writer
    committing without pause).  Taken here, at BEGIN, the snapshot is retried until the busy
    timeout while nothing of the caller's block has run; once taken it holds to the end of
    the transaction, whose later reads never meet this.

    Raises:
        CatalogError: the wal-index stayed unusable for the whole busy timeout.
        sqlite3.Error: any other failure, for the caller to translate.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    delay = 0.001
    while True:
        raw.execute("BEGIN")
        try:
            # Reads the schema cookie: the read transaction, and its snapshot, start here.
            raw.execute("PRAGMA schema_version").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            code = getattr(exc, "sqlite_errorcode", None)
            if code not in (_SQLITE_READONLY_RECOVERY, _SQLITE_READONLY_CANTINIT):
                raise
            if time.monotonic() + delay > deadline:
                raise CatalogError(
                    f"the catalog {database} could not be read without writing to it: its "
                    f"wal-index ({database}-shm) stayed unusable to a reader for the busy "
                    f"timeout ({timeout_ms} ms); a process that may write the pool repairs it "
                    f"by opening it ({exc})"
                ) from exc
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class ReaderConnection(sqlite3.Connection):
    """A reader's sqlite3 connection, with how it was opened (see `sqlite_read_mode`)."""

    read_mode: str = "ro"
    database: str = ""
    stamp: tuple[int, ...] | None = None


def file_stamp(database: str) -> tuple[int, ...] | None:
    """What changes when anything writes the file: inode, size, mtime, ctime."""
    try:
        st = os.stat(database)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_READER_OPEN_ATTEMPTS = 5


def connect_reader(database: str, timeout_ms: int) -> ReaderConnection:
    """A reader's connection to ``database`` (`sqlite_read_mode`, `reader_uri`) that has read
    it once; BEGIN comes from the caller (``isolation_level`` None).

    NOTE: the ``-wal`` and ``-shm`` a live process had open when the mode was chosen are
    deleted when its last connection closes, and a read-only ``-shm`` is not created again:
    the first read then fails (SQLITE_CANTOPEN, seen with two threads creating one pool),
    and the mode is chosen anew (the main file now holds every commit).  Once it has read,
    the connection keeps its lock on the file, so the last writer leaves both files alone.

    Raises:
        CatalogError: as `sqlite_read_mode`.
        sqlite3.Error: the file cannot be opened or read, for the caller to translate.
    """
    attempts = 0
    while True:
        attempts += 1
        mode = sqlite_read_mode(database)
        stamp = file_stamp(database)
        raw = sqlite3.connect(
            reader_uri(database, mode),
            uri=True,
            timeout=timeout_ms / 1000.0,
            factory=ReaderConnection,
            check_same_thread=False,
            isolation_level=None,
        )
        assert isinstance(raw, ReaderConnection)
        try:
            raw.execute("PRAGMA schema_version").fetchone()
        except sqlite3.OperationalError as exc:
            raw.close()
            vanished = (
                mode == "ro" and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == _SQLITE_CANTOPEN
            )
            if not vanished or attempts == _READER_OPEN_ATTEMPTS:
                raise
            continue
        raw.read_mode, raw.database, raw.stamp = mode, database, stamp
        return raw
