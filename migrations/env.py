"""Alembic environment of the archive_manager catalog.

The library passes its own connection, already inside the write transaction that holds the
whole upgrade, in ``config.attributes["connection"]`` (Alembic's connection-sharing recipe).
Run by the alembic CLI instead (developers writing revisions), it makes its engine from
``$ARCHIVE_MANAGER_CATALOG_URL`` the same way the library does.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from archive_manager.catalog.engine import make_engine
from archive_manager.catalog.migrate import CATALOG_URL_ENV, VERSION_TABLE, migration_connection
from archive_manager.catalog.models import metadata

config = context.config
target_metadata = metadata

_OPTIONS: dict[str, Any] = {
    "target_metadata": target_metadata,
    "version_table": VERSION_TABLE,
    # Batch blocks are plain ALTERs on PostgreSQL and "move and copy" on SQLite, so one
    # revision serves both.
    "render_as_batch": True,
    "compare_type": True,
}


def _url() -> str:
    url = os.environ.get(CATALOG_URL_ENV) or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit(f"set {CATALOG_URL_ENV} to the catalog's URL")
    return url


def _run_in(connection: Connection) -> None:
    # transactional_ddl: our own BEGIN makes SQLite DDL transactional, so every revision of
    # an upgrade commits (or rolls back) together.
    context.configure(connection=connection, transactional_ddl=True, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the upgrade as SQL text (``alembic upgrade --sql``)."""
    context.configure(url=_url(), literal_binds=True, **_OPTIONS)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against the shared connection, or a fresh engine for the alembic CLI."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_in(connection)
        return
    engine = make_engine(_url())
    try:
        with migration_connection(engine) as conn:
            _run_in(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
