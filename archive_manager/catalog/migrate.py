"""Alembic, driven from code: where the revisions are, which one a catalog is at, upgrades.

A new catalog is created by upgrading an empty database to head (never ``create_all``), so
it is stamped like any other. A revision this library does not know was written by a newer
library, and the catalog is refused rather than guessed at.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection, Engine

from .._util.constants import CATALOG_URL_ENV, HEAD_REVISION, VERSION_TABLE
from ..errors import CatalogError, CatalogVersionError
from .dialects.base import WRITE_OPTION
from .forks import begin_write, end_write, holding
from .models import FORMAT_VERSION, metadata, pool_info_table
from .urls import shown_url

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "CATALOG_URL_ENV",
    "HEAD_REVISION",
    "VERSION_TABLE",
    "check_current",
    "current_revision",
    "ensure_current",
    "head_revision",
    "known_revisions",
    "migration_connection",
    "script_location",
    "upgrade",
]

# Not an upgrade by the distribution's name: it is not on PyPI (errors.extra_hint).
_UPGRADE_HINT = (
    "upgrade archive_manager (pip install -e . in an updated checkout, or a newer wheel)"
)


def script_location() -> Path:
    """The folder of the Alembic environment (``env.py``, ``versions/``)."""
    # NOTE: a source checkout's own folder first: an editable install maps
    # archive_manager._migrations to the checkout it was installed from, which another
    # worktree on sys.path must not take for its own revisions.
    beside = Path(__file__).resolve().parents[2] / "migrations"
    if (beside / "env.py").is_file() and (beside / "versions" / "0001_initial.py").is_file():
        return beside
    spec = importlib.util.find_spec("archive_manager._migrations")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "env.py").is_file():
                return Path(location)
    raise CatalogError("the catalog migrations (archive_manager._migrations) are not installed")


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    # ConfigParser interpolation: a literal '%' in the path must be doubled.
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.lru_cache(maxsize=4)
def _script_directory(location: str) -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", location.replace("%", "%%"))
    return ScriptDirectory.from_config(config)


def _script() -> ScriptDirectory:
    return _script_directory(str(script_location()))


def head_revision() -> str:
    """The newest revision this library knows."""
    return HEAD_REVISION


def script_head_revision() -> str:
    """The newest revision of the migration scripts, as Alembic finds it."""
    head = _script().get_current_head()
    if head is None:
        raise CatalogError("the catalog migrations have no revision")
    return head


def known_revisions() -> frozenset[str]:
    """Every revision this library knows."""
    return frozenset(script.revision for script in _script().walk_revisions())


def _current_in(conn: Connection) -> str | None:
    # What Alembic's MigrationContext.get_current_heads reads, without importing Alembic.
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    heads = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(heads) > 1:
        raise CatalogVersionError(
            f"the catalog has several revisions at once ({', '.join(sorted(heads))}); "
            f"it was migrated by a newer or a forked archive_manager; {_UPGRADE_HINT}"
        )
    return heads[0] if heads else None


def current_revision(bind: Engine | Connection) -> str | None:
    """The revision a catalog is at, or None for a database the catalog was never created in."""
    if isinstance(bind, Connection):
        return _current_in(bind)
    with bind.connect() as conn, conn.begin():
        return _current_in(conn)


def _check_known(revision: str | None, where: str) -> None:
    if revision is not None and revision != HEAD_REVISION and revision not in known_revisions():
        raise CatalogVersionError(
            f"the catalog {where} is at revision {revision!r}, which this archive_manager does "
            f"not know (its newest is {head_revision()!r}): the catalog is newer than this "
            f"library; {_UPGRADE_HINT}"
        )


def _format_version_in(conn: Connection) -> int | None:
    value = conn.execute(
        select(pool_info_table.c.value).where(pool_info_table.c.key == "format_version")
    ).scalar_one_or_none()
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CatalogError(f"the pool's format_version is not an integer: {value!r}") from None


def _check_format(found: int | None, where: str) -> None:
    if found is not None and found > FORMAT_VERSION:
        raise CatalogVersionError(
            f"the pool {where} has format version {found}, newer than this archive_manager's "
            f"{FORMAT_VERSION}: {_UPGRADE_HINT}"
        )


def _where(bind: Engine | Connection) -> str:
    return shown_url(bind.engine.url)


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in one write transaction fit for running migrations; commits on exit.

    On SQLite, foreign keys are off for its length and checked before commit: batch mode
    "move and copy" drops and recreates tables, and with enforcement on, dropping
    ``archives`` would cascade-delete every row that refers to it. On PostgreSQL the writers'
    advisory lock (taken at BEGIN, as for every write) makes concurrent first opens, and
    upgrades and saves, take turns.
    """
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection if conn.dialect.name == "sqlite" else None
        if raw is not None:
            # NOTE: this pragma is a no-op inside a transaction, so it goes before BEGIN.
            raw.execute("PRAGMA foreign_keys = OFF")
        # a fork waits for this transaction too (`forks`)
        gate = begin_write() if raw is not None else None
        try:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                if gate is not None:
                    holding(gate)
                yield conn
                if raw is not None:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise CatalogError(
                            f"migrating the catalog would break {len(broken)} foreign key(s), "
                            f"first {tuple(broken[0])}; nothing was changed"
                        )
        finally:
            if gate is not None:
                end_write(gate)
            if raw is not None:
                try:
                    raw.execute("PRAGMA foreign_keys = ON")
                except Exception:
                    # A connection whose pragmas are unknown must not go back to the pool.
                    conn.invalidate()
                    raise


# NOTE: Alembic keeps its running environment in module globals, so two threads migrating
# two catalogs at once broke each other (KeyError: 'script').
_ALEMBIC_LOCK = threading.Lock()


def _run_upgrade(conn: Connection, revision: str) -> None:
    from alembic import command

    with _ALEMBIC_LOCK:
        command.upgrade(_config(conn), revision)


def _upgrade_in(conn: Connection, revision: str) -> None:
    _check_known(_current_in(conn), _where(conn))
    _run_upgrade(conn, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the catalog to ``revision``, every step in one transaction.

    Raises:
        CatalogVersionError: The catalog is at a revision this library does not know.
    """
    with migration_connection(engine) as conn:
        _upgrade_in(conn, revision)


def _foreign_catalog_tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names()) & set(metadata.tables)


def check_current(engine: Engine) -> str:
    """For a reader: check that the catalog is at this library's head, changing nothing.

    A read-only open cannot migrate, and an older or newer schema cannot be read safely.

    Returns:
        The head revision.

    Raises:
        CatalogVersionError: The catalog is newer than this library, or older (then the
            message says to upgrade it once with write access).
        CatalogError: There is no catalog in the database.
    """
    head, where = head_revision(), _where(engine)
    with engine.connect() as conn, conn.begin():
        current = _current_in(conn)
        _check_known(current, where)
        if current is None:
            raise CatalogError(f"there is no catalog in {where} (a read-only open creates none)")
        found = _format_version_in(conn)
        _check_format(found, where)
    if current != head or found != FORMAT_VERSION:
        raise CatalogVersionError(
            f"the catalog {where} is at revision {current!r}, older than this archive_manager's "
            f"{head!r}, and a read-only open cannot migrate it: run 'archive-manager db "
            "upgrade' once with write access (or read it with the archive_manager that wrote it)"
        )
    return head


def ensure_current(engine: Engine) -> str:
    """Create a new catalog at head or upgrade an older one; refuse a newer one.

    Checks read-only first, so that opening an up-to-date catalog never takes the write lock.

    Returns:
        The head revision the catalog is now at.

    Raises:
        CatalogVersionError: The catalog's revision or the pool's ``format_version`` is newer
            than this library.
        CatalogError: The database holds catalog tables but no revision stamp.
    """
    head, where = head_revision(), _where(engine)
    with engine.connect() as conn, conn.begin():
        current = _current_in(conn)
        _check_known(current, where)
        if current is not None:
            _check_format(_format_version_in(conn), where)
            if current == head and _format_version_in(conn) == FORMAT_VERSION:
                return head
    with migration_connection(engine) as conn:
        # Re-read under the write lock: another process may have migrated meanwhile.
        current = _current_in(conn)
        _check_known(current, where)
        if current is None and _foreign_catalog_tables(conn):
            raise CatalogError(
                f"the database {where} holds catalog tables "
                f"({', '.join(sorted(_foreign_catalog_tables(conn)))}) but no revision stamp "
                f"({VERSION_TABLE}); it was not made by archive_manager, refusing to touch it"
            )
        if current is not None:
            _check_format(_format_version_in(conn), where)
        if current != head:
            _run_upgrade(conn, "head")
        found = _format_version_in(conn)
        if found is None:
            conn.execute(
                pool_info_table.insert().values(key="format_version", value=str(FORMAT_VERSION))
            )
        elif found < FORMAT_VERSION:
            conn.execute(
                pool_info_table.update()
                .where(pool_info_table.c.key == "format_version")
                .values(value=str(FORMAT_VERSION))
            )
    return head
