"""SQLite: ``entries`` and ``sample_metadata`` become WITHOUT ROWID tables.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

Both tables are keyed by ``(archive_id, position)``.  As rowid tables, SQLite kept that key
twice: in the table (behind a hidden rowid) and in an automatic unique index, about 15 bytes
a sample each.  A WITHOUT ROWID table is stored in its primary key's order, so the automatic
indexes go and the other indexes point at ``(archive_id, position)`` instead of a rowid
(docs/architecture/summaries-and-paging.md, "Summaries and paging", on the catalog's size).  Every
row, column and index stays as it was; the upgrade copies both tables once (SQLite's "move and
copy": minutes at ten million samples, in the upgrade's transaction).  PostgreSQL has no rowid:
nothing changes there.
"""

from __future__ import annotations

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

_TABLES = ("entries", "sample_metadata")


def _recreate(with_rowid: bool) -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    for table in _TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_with_rowid": with_rowid}
        ):
            pass


def upgrade() -> None:
    """Copy ``entries`` and ``sample_metadata`` into WITHOUT ROWID tables (SQLite only)."""
    _recreate(with_rowid=False)


def downgrade() -> None:
    """Copy them back into rowid tables (SQLite only)."""
    _recreate(with_rowid=True)
