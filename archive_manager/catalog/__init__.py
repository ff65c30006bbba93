"""The SQL catalog: schema, engine set-up, migrations, and the only way to run transactions.

Usage::

    with Catalog.open("sqlite:////pool/catalog.db") as catalog:
        with catalog.write() as conn:          # BEGIN IMMEDIATE; commit, or roll back on error
            conn.execute(insert(entries_table), rows)
        with catalog.read() as conn:           # one consistent snapshot, rolled back at exit
            conn.execute(select(archives_table)).all()

``Catalog.open(url, read_only=True)`` only reads: it creates and migrates nothing, and
`Catalog.write` raises `ReadOnlyPoolError` before anything begins
(docs/architecture/shared-pools.md, "Shared pools").

The catalog knows nothing of blob files; it only indexes them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Engine, RootTransaction

from .._util.failpoints import failpoint
from .._util.permissions import share_new_catalog
from ..errors import CatalogError, ReadOnlyPoolError
from .bulk import insert_rows
from .engine import (
    BUSY_TIMEOUT_ENV,
    DEFAULT_BUSY_TIMEOUT_MS,
    LAZY_COMMIT_OPTION,
    WRITE_OPTION,
    CatalogUnreachableError,
    check_local_filesystem,
    check_read_unchanged,
    dialect_for,
    filesystem_type,
    is_network_filesystem,
    make_engine,
    parse_url,
    pin_write_lock,
    read_mount_table,
    resolve_busy_timeout_ms,
    shown_url,
    sqlite_path,
)
from .forks import begin_write, end_write, holding
from .migrate import check_current, current_revision, ensure_current, head_revision, upgrade
from .models import (
    ARCHIVE_STATES,
    BLOB_KINDS,
    BLOB_STATES,
    CURRENT_STATES,
    FORMAT_VERSION,
    STATUS_LENGTH,
    archive_blobs_table,
    archive_sketches_table,
    archive_summaries_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    journal_table,
    lease_blobs_table,
    leases_table,
    metadata,
    pool_info_table,
    retention_table,
    sample_metadata_table,
    sample_rewards_table,
    task_texts_table,
)
from .probe import probe_sqlite_catalog

__all__ = [
    "ARCHIVE_STATES",
    "BLOB_KINDS",
    "BLOB_STATES",
    "BUSY_TIMEOUT_ENV",
    "CURRENT_STATES",
    "DEFAULT_BUSY_TIMEOUT_MS",
    "FORMAT_VERSION",
    "STATUS_LENGTH",
    "Catalog",
    "CatalogUnreachableError",
    "archive_blobs_table",
    "archive_sketches_table",
    "archive_summaries_table",
    "archives_table",
    "blobs_table",
    "check_local_filesystem",
    "chunks_table",
    "current_revision",
    "entries_table",
    "filesystem_type",
    "get_pool_info",
    "head_revision",
    "insert_rows",
    "is_network_filesystem",
    "journal_table",
    "lease_blobs_table",
    "leases_table",
    "make_engine",
    "metadata",
    "pin_write_lock",
    "pool_info_table",
    "read_mount_table",
    "retention_table",
    "sample_metadata_table",
    "sample_rewards_table",
    "set_pool_info",
    "task_texts_table",
    "upgrade",
]


# Built once: every save's publication reads the pool id (see catalog.queries, where the
# save's other statements are built once too).
_POOL_INFO_VALUE = select(pool_info_table.c.value).where(pool_info_table.c.key == bindparam("key"))


def get_pool_info(conn: Connection, key: str) -> str | None:
    """The ``pool_info`` value under ``key``, or None."""
    return conn.execute(_POOL_INFO_VALUE, {"key": key}).scalar_one_or_none()


def set_pool_info(conn: Connection, key: str, value: str | None) -> None:
    """Insert or replace the ``pool_info`` value under ``key`` (inside a write transaction)."""
    updated = conn.execute(
        pool_info_table.update().where(pool_info_table.c.key == key).values(value=value)
    )
    if updated.rowcount == 0:
        conn.execute(pool_info_table.insert().values(key=key, value=value))


def _refuse_foreign_sqlite(url: str, *, recover: bool) -> None:
    """Refuse an existing SQLite file that is not a catalog before the engine touches it.

    NOTE: the engine's first connection switches the file to WAL for good, and a migration
    would then add the catalog's tables to another program's database.  A file that cannot
    be told apart here (being created by another process, damaged, no SQLite header) is
    left to the engine, which waits for the creator's lock or reports the damage (SQLite
    writes nothing to a file whose header it does not recognize).
    """
    path = sqlite_path(url)
    if path is None:
        return
    try:
        # recover: a writer's engine would recover a dead writer's log anyway; the probe does
        # it first, so that a foreign database whose tables are all in its log is refused too.
        probe = probe_sqlite_catalog(path, recover=recover)
    except CatalogError:
        return
    if probe.kind == "foreign":
        raise CatalogError(
            f"the file {path} is not an archive_manager catalog ({probe.reason}); refusing "
            "to touch it: name a new or empty file for a new catalog"
        )


class Catalog:
    """An open catalog: an engine on a migrated, version-checked database.

    Use `read` and `write` for every transaction; they are the only place transactions begin
    and end.
    """

    def __init__(
        self,
        engine: Engine,
        url: str,
        *,
        busy_timeout_ms: int | None = None,
        read_only_reason: str | None = None,
    ) -> None:
        """Wrap an engine whose database is already migrated; use `Catalog.open` instead.

        ``read_only_reason`` (None: a writer) says why this catalog is only read here; every
        `write` then raises `ReadOnlyPoolError` with it."""
        self._engine = engine
        self._url = url
        self._busy_timeout_ms = resolve_busy_timeout_ms(busy_timeout_ms)
        self._local = threading.local()
        self._closed = False
        self._read_only_reason = read_only_reason

    @classmethod
    def open(
        cls,
        url: str,
        *,
        busy_timeout_ms: int | None = None,
        check_filesystem: bool = True,
        read_only: bool | None = False,
        read_only_reason: str | None = None,
    ) -> Catalog:
        """Open (creating or upgrading as needed) the catalog at ``url``.

        Args:
            url: A SQLAlchemy URL: ``sqlite:////abs/path/catalog.db`` or a server database.
            busy_timeout_ms: How long a SQLite writer waits for another's lock; None reads
                ``$ARCHIVE_MANAGER_BUSY_TIMEOUT_MS`` or uses 30 s.
            check_filesystem: Refuse a SQLite file on a network filesystem.
            read_only: Only read: create, migrate and write nothing, and refuse every
                `write` (docs/architecture/shared-pools.md, "Shared pools").  None: read-only when
                this process cannot write the catalog (a SQLite file or folder it may not write,
                a PostgreSQL role without INSERT, UPDATE and DELETE on the catalog's tables).
            read_only_reason: Why the caller asked for ``read_only`` (for messages).

        Raises:
            UnsupportedFilesystemError: A SQLite catalog on a network filesystem.
            CatalogVersionError: The catalog was written by a newer archive_manager.
            CatalogLockedError: Another process held the catalog locked for too long.
            CatalogError: The catalog cannot be opened (corrupt file, foreign tables, ...);
                an existing SQLite file that is another program's database is refused
                before anything touches it.
        """
        dialect = dialect_for(url)
        if read_only is None:
            read_only_reason = dialect.unwritable_reason(parse_url(url))
            read_only = read_only_reason is not None
        elif read_only and read_only_reason is None:
            read_only_reason = "it was opened read-only"
        _refuse_foreign_sqlite(url, recover=not read_only)
        new_file = dialect.catalog_file(parse_url(url))
        if new_file is not None and (read_only or os.path.lexists(new_file)):
            new_file = None
        engine = make_engine(
            url,
            busy_timeout_ms=busy_timeout_ms,
            check_filesystem=check_filesystem,
            read_only=read_only,
        )
        try:
            if not read_only:
                refused = dialect.server_unwritable_reason(engine)
                if refused is not None:
                    # A server that lets this role only read gets a reader's engine (READ
                    # ONLY reads).
                    engine.dispose()
                    read_only, read_only_reason = True, refused
                    engine = make_engine(
                        url,
                        busy_timeout_ms=busy_timeout_ms,
                        check_filesystem=check_filesystem,
                        read_only=True,
                    )
            if read_only:
                check_current(engine)
            else:
                ensure_current(engine)
                if new_file is not None:
                    # Created just now: the pool's sharing mode, not this process's umask.
                    share_new_catalog(new_file)
        except BaseException:
            engine.dispose()
            raise
        return cls(
            engine,
            url,
            busy_timeout_ms=busy_timeout_ms,
            read_only_reason=read_only_reason if read_only else None,
        )

    @property
    def read_only(self) -> bool:
        """True when this catalog is only read here (every `write` is refused)."""
        return self._read_only_reason is not None

    @property
    def read_only_reason(self) -> str | None:
        """Why this catalog is only read here, or None for a writer."""
        return self._read_only_reason

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for inspection; run transactions through `read`/`write`)."""
        return self._engine

    @property
    def url(self) -> str:
        """The URL the catalog was opened with."""
        return self._url

    @property
    def dialect_name(self) -> str:
        """``"sqlite"``, ``"postgresql"``, ..."""
        return self._engine.dialect.name

    def __repr__(self) -> str:
        return f"Catalog({shown_url(self._url)!r})"

    def _check_open(self) -> None:
        if self._closed:
            raise CatalogError(f"the catalog {self!r} is closed")

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection in a read transaction: one consistent snapshot, rolled back at exit."""
        self._check_open()
        with self._engine.connect() as conn:
            # NOTE: on PostgreSQL the engine begins reads at REPEATABLE READ (READ COMMITTED
            # would let each statement see a different snapshot).
            transaction = conn.begin()
            try:
                yield conn
            finally:
                try:
                    if self.read_only:
                        check_read_unchanged(conn)
                finally:
                    if transaction.is_active:
                        transaction.rollback()

    @contextmanager
    def write(self, step: str | None = None, *, durable: bool = True) -> Iterator[Connection]:
        """A connection in a write transaction: committed on clean exit, else rolled back.

        ``step`` names the durable step the transaction is (``"save.publish"``, ...): its
        failpoints ``<step>.before_commit`` and ``<step>.after_commit`` (see `_failpoints`)
        bracket the commit.

        ``durable=False`` commits without waiting for the disk (`LAZY_COMMIT_OPTION`): the
        commit is seen by every connection at once and survives the process, but a power loss
        before the catalog's next durable commit may undo it.  Only for a transaction whose
        loss then leaves nothing depending on it (a save's lease:
        docs/architecture/save-protocol.md, "Save protocol").

        On SQLite the transaction starts with ``BEGIN IMMEDIATE``, on PostgreSQL with the
        catalog's advisory write lock, so a second writer waits (up to the busy timeout) at
        its start instead of failing halfway. A catalog server that cannot be reached (a
        restart, a network blip) is waited for too, up to the busy timeout, while nothing of
        the transaction has run. Nothing else is retried: writers that take turns cannot
        deadlock or hit serialization failures (see `engine`), and the block may have done
        file I/O that must not run twice.

        Raises:
            ReadOnlyPoolError: the catalog is only read here; nothing was begun.
            CatalogError: A write is already open on this thread (it would wait for itself),
                or the server stayed unreachable past the busy timeout.
            CatalogLockedError: Another writer held the lock longer than the busy timeout.
        """
        self._check_open()
        if self._read_only_reason is not None:
            # NOTE: the one gate every catalog write of every protocol passes (save, release,
            # retain, GC, rebuild, identity): refused before a transaction begins, so a
            # reader never takes the write lock nor reaches a SQLite or server message.
            raise ReadOnlyPoolError(
                f"the pool's catalog {shown_url(self._url)} is read-only here "
                f"({self._read_only_reason}): saves, releases, retains, gc and rebuilds are "
                "refused; nothing was changed"
            )
        if getattr(self._local, "writing", False):
            raise CatalogError(
                "catalog.write() is already open on this thread; a second one would wait "
                "for the first forever: pass the open connection down instead"
            )
        self._local.writing = True
        # NOTE: before the lock is taken: a fork on another thread waits for this transaction
        # to end, so that no child inherits SQLite's lock (`forks`; a server's locks are its
        # own, and a child's connections to it wait for the parent's commit as any other's)
        gate = begin_write() if self.dialect_name == "sqlite" else None
        try:
            conn, transaction = self._begin_write(durable)
            if gate is not None:
                holding(gate)
            with conn, transaction:
                yield conn
                if step is not None:
                    failpoint(f"{step}.before_commit")
        finally:
            if gate is not None:
                end_write(gate)
            self._local.writing = False
        if step is not None:
            failpoint(f"{step}.after_commit")

    def _begin_write(self, durable: bool = True) -> tuple[Connection, RootTransaction]:
        """Connect and begin a write transaction, waiting out an unreachable server."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        delay = 0.05
        while True:
            conn: Connection | None = None
            try:
                conn = self._engine.connect()
                conn.execution_options(**{WRITE_OPTION: True, LAZY_COMMIT_OPTION: not durable})
                return conn, conn.begin()
            except CatalogUnreachableError:
                # NOTE: safe to retry only because the caller's block has not run yet; the
                # pool's pre-ping drops the dead connections a server restart left behind.
                if conn is not None:
                    conn.close()
                if time.monotonic() + delay > deadline:
                    raise
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def get_pool_info(self, key: str) -> str | None:
        """The ``pool_info`` value under ``key``, or None (its own read transaction)."""
        with self.read() as conn:
            return get_pool_info(conn, key)

    def set_pool_info(self, key: str, value: str | None) -> None:
        """Insert or replace a ``pool_info`` value (its own write transaction)."""
        with self.write() as conn:
            set_pool_info(conn, key, value)

    def pool_info(self) -> dict[str, str | None]:
        """Every ``pool_info`` key and value."""
        with self.read() as conn:
            rows = conn.execute(select(pool_info_table.c.key, pool_info_table.c.value))
            return {key: value for key, value in rows}

    def close(self) -> None:
        """Close every pooled connection; idempotent."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
