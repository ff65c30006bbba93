"""The retention journal's index: which journal records this catalog committed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

Ownership decisions (publish, retain, release, release_owner) are also written as small
record files under ``<root>/journal/`` (docs/architecture/retention-journal.md, "Retention
journal"). The catalog keeps each record it committed since its last checkpoint (number, digest,
bytes), so that a record file it does not know shows that the catalog is behind the pool (restored
from a backup, a lagging replica), and a record file that was never written can be written again.
A new table: nothing to copy on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add the ``journal`` table."""
    op.create_table(
        "journal",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("digest", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_journal")),
    )


def downgrade() -> None:
    """Drop the ``journal`` table."""
    op.drop_table("journal")
