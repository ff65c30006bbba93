"""The quantile sketches move from ``archive_summaries`` to a table of their own.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Two sketches of 1 KiB each made a summary row ten times larger than its figures: on SQLite a
summary took most of a 4 KiB page, and ``stats`` over 10,000 archives read 40 MB to use 2 MB
(docs/architecture/summaries-and-paging.md, "Summaries and paging").  ``archive_sketches`` holds
them, read only to merge the quantiles of several archives of one rollout id.  The upgrade moves
every sketch; the summary (and sketches) of every archive that has none (the archives of a catalog
older than revision 0005) is computed by revision 0011.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``archive_sketches``, move the sketches there, fill missing summaries."""
    op.create_table(
        "archive_sketches",
        sa.Column("archive_id", sa.Integer(), nullable=False),
        sa.Column("reward_sketch", sa.LargeBinary(), nullable=False),
        sa.Column("length_sketch", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["archive_id"],
            ["archives.id"],
            name=op.f("fk_archive_sketches_archive_id_archives"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("archive_id", name=op.f("pk_archive_sketches")),
    )
    op.execute(
        "INSERT INTO archive_sketches (archive_id, reward_sketch, length_sketch) "
        "SELECT archive_id, reward_sketch, length_sketch FROM archive_summaries"
    )
    with op.batch_alter_table("archive_summaries") as batch_op:
        batch_op.drop_column("reward_sketch")
        batch_op.drop_column("length_sketch")
    # NOTE: the summaries of archives that have none are computed by revision 0011: the
    # library's code writes today's tables, not this revision's.


def downgrade() -> None:
    """Put the sketches back into ``archive_summaries``; drop ``archive_sketches``."""
    with op.batch_alter_table("archive_summaries") as batch_op:
        batch_op.add_column(sa.Column("reward_sketch", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("length_sketch", sa.LargeBinary(), nullable=True))
    for column in ("reward_sketch", "length_sketch"):
        op.execute(
            f"UPDATE archive_summaries SET {column} = (SELECT k.{column} FROM archive_sketches k "
            "WHERE k.archive_id = archive_summaries.archive_id)"
        )
    with op.batch_alter_table("archive_summaries") as batch_op:
        for column in ("reward_sketch", "length_sketch"):
            batch_op.alter_column(column, existing_type=sa.LargeBinary(), nullable=False)
    op.drop_table("archive_sketches")
