"""Engine set-up in one place: the registry of supported catalog databases, the one way
engines are made, and what every dialect shares (busy timeout, filesystem check).

Each supported database is a `CatalogDialect` in its own module (`dialects.sqlite`,
`dialects.postgresql`): its engine takes the one write lock at the start of every write
transaction (SQLite ``BEGIN IMMEDIATE``, PostgreSQL an advisory lock), so writers take turns
and the save and GC protocols' correctness argument (docs/architecture/save-protocol.md and
docs/architecture/gc-protocol.md) holds on each; its ``handle_error`` event turns the driver's
errors into `CatalogError`; it tells read-only catalogs apart and does bulk inserts its own fast
way.  Any other database is refused (`dialect_of`): a plain engine would run without the write lock.

A reader's engine (``read_only=True``) never writes: SQLite opens the file ``mode=ro`` or
``immutable=1`` as `sqlite_read_mode` decides, PostgreSQL reads in READ ONLY transactions
(docs/architecture/shared-pools.md, "Shared pools").

NOTE: no retry of serialization failures or deadlocks (SQLSTATE 40001, 40P01). With one lock
taken first by every writer, two archive_manager writers never hold row locks at once, so
they cannot deadlock; READ COMMITTED writers never get 40001, and REPEATABLE READ readers,
which only read, never do either. Such an error therefore means a foreign program (or a
migration racing a reader) touched the tables; it is reported as a `CatalogError` saying so.
A transparent retry would have to re-run the caller's block, which may have done file I/O
(GC unlinks inside it), and a context manager cannot re-run its body anyway.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL, Connection, Engine

from .._util.constants import BUSY_TIMEOUT_ENV
from .._util.mounts import (
    NETWORK_FILESYSTEMS,
    filesystem_type,
    is_network_filesystem,
    read_mount_table,
)
from ..errors import CatalogError, UnsupportedFilesystemError
from .dialects.base import (
    LAZY_COMMIT_OPTION,
    WRITE_OPTION,
    CatalogDialect,
    CatalogUnreachableError,
)
from .dialects.sqlite import (
    LockHolder,
    SQLiteDialect,
    check_journal_mode,
    parse_lock_table,
    sqlite_lock_holders,
    sqlite_locked_message,
    sqlite_read_mode,
)
from .urls import catalog_identity, parse_url, public_url, shown_url, sqlite_path

__all__ = [
    "BUSY_TIMEOUT_ENV",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "LAZY_COMMIT_OPTION",
    "NETWORK_FILESYSTEMS",
    "WRITE_OPTION",
    "CatalogDialect",
    "CatalogUnreachableError",
    "LockHolder",
    "catalog_identity",
    "check_journal_mode",
    "check_local_filesystem",
    "check_read_unchanged",
    "dialect_for",
    "dialect_named",
    "dialect_of",
    "filesystem_type",
    "is_network_filesystem",
    "make_engine",
    "parse_lock_table",
    "parse_url",
    "pin_write_lock",
    "public_url",
    "read_mount_table",
    "resolve_busy_timeout_ms",
    "shown_url",
    "sqlite_lock_holders",
    "sqlite_locked_message",
    "sqlite_path",
    "sqlite_read_mode",
]

DEFAULT_BUSY_TIMEOUT_MS = 30_000


def resolve_busy_timeout_ms(value: int | None = None) -> int:
    """The busy timeout to use: ``value``, else ``$ARCHIVE_MANAGER_BUSY_TIMEOUT_MS``, else 30 s."""
    if value is None:
        raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_BUSY_TIMEOUT_MS
        try:
            value = int(raw)
        except ValueError:
            raise CatalogError(f"{BUSY_TIMEOUT_ENV} must be an integer (ms), not {raw!r}") from None
    if value < 0:
        raise CatalogError(f"busy timeout must be >= 0 ms, not {value}")
    return value


# --- the SQLite catalog's filesystem check (the mount table is read by `_mounts`) ----------


def check_local_filesystem(folder: str | os.PathLike[str], mount_table: str | None = None) -> None:
    """Raise `UnsupportedFilesystemError` if ``folder`` lies on a network filesystem.

    Args:
        folder: The folder that holds (or will hold) a SQLite catalog file.
        mount_table: The mount table's text; read from ``/proc`` when None. Where no mount
            table exists, nothing can be told and the check passes.
    """
    if mount_table is None:
        mount_table = read_mount_table()
        if mount_table is None:
            return
    path = os.path.realpath(folder)
    fstype = filesystem_type(path, mount_table)
    if fstype is not None and is_network_filesystem(fstype):
        raise UnsupportedFilesystemError(
            f"refusing to put a SQLite catalog on {path}: it is on a {fstype} filesystem, where "
            "SQLite's file locking is unreliable and concurrent writers can corrupt the "
            "catalog; keep the catalog on a local disk, or use a server catalog "
            "(catalog_url='postgresql+psycopg://user@host/dbname')"
        )


# --- the registry of supported catalog databases -----------------------------------------

# docs/architecture/safety-rules.md, "Safety rules": the catalog serialises writers.  A database is
# added here with its dialect module, or not at all.
# NOTE: each dialect's module is imported when a URL first names its database: a SQLite
# pool never imports the PostgreSQL one (docs/architecture/start-up.md, "Start-up").
_DIALECT_CLASSES: dict[str, Callable[[], type[CatalogDialect]]] = {
    "sqlite": lambda: SQLiteDialect,
    "postgresql": lambda: (
        importlib.import_module(".dialects.postgresql", __package__).PostgreSQLDialect
    ),
}
_LOADED: dict[str, CatalogDialect] = {}


def _dialect(name: str) -> CatalogDialect:
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = _DIALECT_CLASSES[name]()()
    return found


_POSTGRESQL_NAMES = ("PG_WRITE_LOCK", "POSTGRES_EXTRA_HINT", "idle_in_transaction_timeout_ms")


def __getattr__(name: str) -> Any:
    """The PostgreSQL dialect's names this module used to import eagerly, on first use."""
    if name in _POSTGRESQL_NAMES:
        return getattr(importlib.import_module(".dialects.postgresql", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dialect_named(name: str) -> CatalogDialect:
    """The registered `CatalogDialect` called ``name`` (a connection's ``dialect.name``).

    Raises:
        CatalogError: no such dialect is supported (engines are made only for those that
            are, so a catalog's connection never gets here).
    """
    if name not in _DIALECT_CLASSES:
        raise CatalogError(f"archive_manager does not support {name!r} catalog databases")
    return _dialect(name)


def dialect_of(url: str | URL) -> str:
    """The name of the catalog database ``url`` names (``sqlite``, ``postgresql``).

    Raises:
        CatalogError: the URL is malformed, or names a database this library does not support:
            the protocols rely on the write lock each supported dialect sets up, which a
            plain engine of another database would run without.
    """
    parsed = parse_url(url)
    name = parsed.get_backend_name()
    if name not in _DIALECT_CLASSES:
        supported = ", ".join(f"{n} ({_dialect(n).write_lock})" for n in sorted(_DIALECT_CLASSES))
        raise CatalogError(
            f"the catalog URL {shown_url(parsed)} names a {name!r} database, which archive_manager "
            f"does not support: saves and GC need a catalog that serialises writers, and only "
            f"these are set up to: {supported}"
        )
    return name


def dialect_for(url: str | URL) -> CatalogDialect:
    """The `CatalogDialect` of the database ``url`` names; `CatalogError` as `dialect_of`."""
    return _dialect(dialect_of(url))


def make_engine(
    url: str | URL,
    *,
    busy_timeout_ms: int | None = None,
    check_filesystem: bool = True,
    read_only: bool = False,
) -> Engine:
    """Create the catalog's engine; the only place engines are made.

    Args:
        url: A SQLAlchemy URL. SQLite must be a file; PostgreSQL (``postgresql+psycopg://``;
            a bare ``postgresql://`` means psycopg 3 too) gets the write lock described above;
            other databases are refused.
        busy_timeout_ms: How long a writer waits for another's lock; None reads
            ``$ARCHIVE_MANAGER_BUSY_TIMEOUT_MS`` or uses 30 s.
        check_filesystem: Refuse a SQLite file on a network filesystem.
        read_only: A reader's engine: it never creates, switches or migrates anything (see
            `sqlite_read_mode` for SQLite; PostgreSQL reads in READ ONLY transactions).

    Raises:
        UnsupportedFilesystemError: The SQLite file's folder is on a network filesystem.
        CatalogError: The URL is malformed, names a database other than SQLite and
            PostgreSQL (`dialect_of`), an in-memory SQLite database, or its driver is
            missing.
    """
    dialect = dialect_for(url)
    parsed = parse_url(url)
    file = dialect.catalog_file(parsed)
    if check_filesystem and file is not None:
        check_local_filesystem(file.absolute().parent)
    return dialect.make_engine(
        parsed, resolve_busy_timeout_ms(busy_timeout_ms), read_only=read_only
    )


def pin_write_lock(conn: Connection) -> None:
    """Keep this write transaction's lock until it ends, however long the process stops.

    Call it inside `Catalog.write` before doing file I/O that other writers rely on happening
    while this transaction holds the write lock (unlinking blobs: a save that finds a blob
    ``deleting`` writes it anew, and a stopped GC whose session the server ended would unlink
    the new file when it resumes). On PostgreSQL it lifts the idle-in-transaction bound
    (`idle_in_transaction_timeout_ms`) for the rest of the transaction, so a process stopped
    from now on blocks every writer until it resumes, as on SQLite; if the server already
    ended the session, this statement fails and the caller unlinks nothing. Elsewhere a
    no-op: SQLite never takes a lock from its holder.
    """
    dialect_named(conn.dialect.name).pin_write_lock(conn)


def check_read_unchanged(conn: Connection) -> None:
    """At the end of a reader's read transaction: refuse what it read if it cannot be trusted
    (a SQLite catalog read as an unchanging file that changed meanwhile: see
    `dialects.sqlite.check_read_unchanged`).

    Raises:
        CatalogError: what was read cannot be trusted; the connection is dropped, so a retry
            reads anew.
    """
    dialect_named(conn.dialect.name).check_read_unchanged(conn)
