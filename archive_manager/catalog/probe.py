"""A read-only look at a SQLite file before anything opens it as a catalog.

Opening a catalog changes its file: the engine switches it to WAL mode (which persists in the
file and creates ``-wal`` and ``-shm`` beside it) and may migrate it.  A file that turns out
not to be a catalog must be left exactly as it was, so `ArchiveManager.exists`, `catalog_status`
and a pointer file's pool are looked at through `probe_sqlite_catalog` first: the file's
header is read with plain ``read(2)``, and its tables through a connection that cannot write.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import CatalogError, CatalogVersionError
from .dialects.sqlite import begin_read_snapshot, connect_reader, sqlite_read_mode
from .migrate import VERSION_TABLE
from .models import metadata

__all__ = ["SQLITE_HEADER", "SqliteProbe", "probe_sqlite_catalog"]

SQLITE_HEADER = b"SQLite format 3\x00"

ProbeKind = Literal["absent", "empty", "not-sqlite", "foreign", "catalog"]


@dataclass(frozen=True)
class SqliteProbe:
    """What a SQLite path holds.

    ``kind`` is ``"absent"`` (no file), ``"empty"`` (a database with no table: a pool may be
    created in it), ``"not-sqlite"`` (a regular file without SQLite's header: another kind
    of file, or a catalog damaged beyond recognition), ``"foreign"`` (another program's
    database, or no regular file) or ``"catalog"`` (stamped by archive_manager; ``revision``
    is its Alembic revision, None while the stamp holds none).  ``reason`` says why a file
    is not a catalog.
    """

    kind: ProbeKind
    revision: str | None = None
    reason: str = ""


# NOTE: closing any descriptor of a file drops every POSIX lock this process holds on it,
# SQLite's among them (https://www.sqlite.org/howtocorrupt.html, 2.2): a probe that opened and
# closed a catalog that a connection of this process has open would let another process take
# the live writer's WAL for a dead one's and delete it.  So a descriptor opened here stays open
# for the life of the process, and is replaced only when the path names another file.
_HEADER_FDS: dict[str, int] = {}
_SQLITE_CANTOPEN = 14
_HEADER_LOCK = threading.Lock()


def _read_header(path: Path) -> bytes | SqliteProbe:
    # NOTE: O_NONBLOCK and a regular-file check before reading: a FIFO named catalog.db
    # would block open(2) forever, and SQLite itself would hang on it too.
    key = os.path.realpath(path)
    with _HEADER_LOCK:
        fd = _HEADER_FDS.get(key)
        if fd is not None:
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(key))
            except OSError:
                same = False
            if not same:
                # Another file at this path (or none): this descriptor's inode is one no
                # connection of ours uses through this path any more.
                del _HEADER_FDS[key]
                fd = None
        if fd is None:
            try:
                fd = os.open(key, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except FileNotFoundError:
                return SqliteProbe("absent")
            except OSError as exc:
                raise CatalogError(
                    f"cannot read the catalog file {path}: {exc.strerror or exc}"
                ) from exc
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)  # not a file SQLite could have open
                return SqliteProbe("foreign", reason="not a regular file")
            _HEADER_FDS[key] = fd
        return os.pread(fd, 100, 0)


def _connect(path: Path, timeout_s: float, *, recover: bool) -> sqlite3.Connection:
    """A connection that reads ``path`` in a read transaction begun, writing nothing to it
    (a reader's URI: docs/architecture/shared-pools.md, "Shared pools"), or, with ``recover``, one
    that may first recover a log only a writable open can read."""
    timeout_ms = int(timeout_s * 1000)
    try:
        mode: str | None = sqlite_read_mode(path)
    except CatalogError:
        # A -wal with commits and no -shm: the main file alone is not the catalog.
        if not recover or not _may_write(path):
            raise
        mode = None
    # SQLite puts -wal and -shm beside the file a symlink names.
    absolute = Path(os.path.realpath(path))
    conn: sqlite3.Connection
    try:
        if mode is None:
            # NOTE: mode=rw does what any writable open does first: SQLite rebuilds -shm and
            # reads the log; the catalog's content stays as it was; no file is created.
            uri = f"{absolute.as_uri()}?mode=rw"
            conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
        else:
            conn = connect_reader(str(absolute), timeout_ms)
    except sqlite3.Error as exc:
        if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF != _SQLITE_CANTOPEN:
            raise  # a file SQLite opened and could not read: `_unusable`
        raise CatalogError(f"cannot read the catalog file {path} ({exc})") from exc
    try:
        begin_read_snapshot(conn, str(absolute), timeout_ms)
    except BaseException:
        conn.close()
        raise
    return conn


def _may_write(path: Path) -> bool:
    """Whether this process may write the catalog file and its folder (for -wal/-shm)."""
    # NOTE: access(2) answers EROFS on a read-only mount even to root.
    folder = Path(os.path.realpath(path)).parent
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK | os.X_OK)


def _unusable(path: Path, exc: sqlite3.Error) -> CatalogError:
    return CatalogError(
        f"the catalog file {path} is not a usable SQLite database ({exc}): it is "
        "truncated or corrupt; restore it from a backup or rebuild it from the manifests "
        "('archive-manager rebuild-catalog')"
    )


def probe_sqlite_catalog(
    path: str | os.PathLike[str], *, timeout_s: float = 5.0, recover: bool = False
) -> SqliteProbe:
    """Tell what the SQLite file at ``path`` is, without changing it or creating any file.

    A catalog whose writer died leaving a ``-wal`` with commits and no ``-shm`` cannot be
    read so (`sqlite_read_mode`): its main file alone may hold no table at all.  With
    ``recover`` (the caller opens the catalog for writing next, which would recover it
    anyway) and write access, the probe lets SQLite recover the log first, changing files
    but not the catalog's content; otherwise it raises.

    Raises:
        CatalogError: the file cannot be read, is a SQLite file too damaged to tell, or has
            a log that only a writable open recovers (see above).
        CatalogVersionError: the catalog has several revisions at once (a forked library).
    """
    path = Path(path)
    header = _read_header(path)
    if isinstance(header, SqliteProbe):
        return header
    if not header:
        return SqliteProbe("empty")
    if not header.startswith(SQLITE_HEADER):
        return SqliteProbe("not-sqlite", reason="not a SQLite database")
    try:
        conn = _connect(path, timeout_s, recover=recover)
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if VERSION_TABLE not in tables:
            if not tables:
                return SqliteProbe("empty")
            ours = sorted(tables & set(metadata.tables))
            reason = (
                f"catalog tables ({', '.join(ours)}) but no revision stamp ({VERSION_TABLE})"
                if ours
                else f"tables of another program, no {VERSION_TABLE} table"
            )
            return SqliteProbe("foreign", reason=reason)
        heads = [row[0] for row in conn.execute(f'SELECT version_num FROM "{VERSION_TABLE}"')]
    except sqlite3.Error as exc:
        raise _unusable(path, exc) from exc
    finally:
        conn.close()
    if len(heads) > 1:
        raise CatalogVersionError(
            f"the catalog {path} has several revisions at once ({', '.join(sorted(heads))}); "
            "it was migrated by a newer or a forked archive_manager"
        )
    return SqliteProbe("catalog", revision=heads[0] if heads else None)
