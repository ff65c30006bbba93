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
from .migrate import VERSION_TABLE
from .models import Base

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


def _read_only_uri(path: Path) -> str:
    # SQLite puts -wal and -shm beside the file a symlink names: look there.
    absolute = Path(os.path.realpath(path))
    wal, shm = Path(f"{absolute}-wal"), Path(f"{absolute}-shm")
    # NOTE: a read-only connection to a WAL file creates -wal and -shm when they are
    # missing (and, unable to delete them, leaves them behind).  Without a -wal file every
    # committed page is in the main file, so ``immutable=1`` (no locks, no side files) reads
    # all there is; a live WAL database (both files present) is read through them.
    mode = "mode=ro" if wal.exists() and shm.exists() else "immutable=1"
    return f"{absolute.as_uri()}?{mode}"


def probe_sqlite_catalog(path: str | os.PathLike[str], *, timeout_s: float = 5.0) -> SqliteProbe:
    """Tell what the SQLite file at ``path`` is, without changing it or creating any file.

    Raises:
        CatalogError: the file cannot be read, or is a SQLite file too damaged to tell.
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
        conn = sqlite3.connect(_read_only_uri(path), uri=True, timeout=timeout_s)
    except sqlite3.Error as exc:
        raise CatalogError(f"cannot read the catalog file {path} ({exc})") from exc
    try:
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if VERSION_TABLE not in tables:
            if not tables:
                return SqliteProbe("empty")
            ours = sorted(tables & set(Base.metadata.tables))
            reason = (
                f"catalog tables ({', '.join(ours)}) but no revision stamp ({VERSION_TABLE})"
                if ours
                else f"tables of another program, no {VERSION_TABLE} table"
            )
            return SqliteProbe("foreign", reason=reason)
        heads = [row[0] for row in conn.execute(f'SELECT version_num FROM "{VERSION_TABLE}"')]
    except sqlite3.Error as exc:
        raise CatalogError(
            f"the catalog file {path} is not a usable SQLite database ({exc}): it is "
            "truncated or corrupt; restore it from a backup or rebuild it from the manifests "
            "('archive-manager rebuild-catalog')"
        ) from exc
    finally:
        conn.close()
    if len(heads) > 1:
        raise CatalogVersionError(
            f"the catalog {path} has several revisions at once ({', '.join(sorted(heads))}); "
            "it was migrated by a newer or a forked archive_manager"
        )
    return SqliteProbe("catalog", revision=heads[0] if heads else None)
