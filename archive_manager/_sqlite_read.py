"""How a process that must write nothing opens a SQLite catalog file (docs/architecture.md,
Shared pools): which read mode (`sqlite_read_mode`) and the URI (`reader_uri`).

Standard library only: the catalog's SQLite dialect reads through these, and so does the
CLI's archive-name completion, which must not import SQLAlchemy (docs/architecture.md,
Start-up).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CatalogError

__all__ = ["reader_uri", "sqlite_read_mode"]

# Bytes of a WAL file's header: a shorter -wal holds no commit (docs/architecture.md, Shared
# pools).
_WAL_HEADER = 32


def sqlite_read_mode(path: str | os.PathLike[str]) -> str:
    """How a reader that must write nothing opens the SQLite catalog ``path``: ``"ro"`` or
    ``"immutable"`` (docs/architecture.md, Shared pools).

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
    (tests/test_shared_breaks.py reads a crashed writer's pool so).
    """
    query = "mode=ro&readonly_shm=1" if mode == "ro" else "immutable=1"
    return f"{Path(database).absolute().as_uri()}?{query}"
