"""Rewards that are not a number: the key chosen at save, and every numeric part kept.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

A dict of named rewards (slime's ``--reward-key`` picks one) gave the catalog no number, and
the RL lens went blank.  ``archives.reward_key`` keeps the key given at save;
``sample_rewards`` keeps the numeric parts of every reward that is not a number (a row of
component ``""`` marks such a sample), so that another key can be chosen by ``stats``,
``query`` and ``groups`` from the catalog alone; ``archive_summaries.unscored`` counts the
samples whose reward gave no number, and ``reward_components`` the keys their dicts hold (to
say which to choose).  Archives saved before have neither: their samples' rewards were
described without their parts, so none can be chosen later (their counts are 0).  The summary
of every archive that has none is computed here (the fill of revision 0009 moves here: the
library's code writes today's tables).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``archives.reward_key``, ``sample_rewards`` and the summaries' reward counts."""
    with op.batch_alter_table("archives") as batch_op:
        batch_op.add_column(sa.Column("reward_key", sa.String(length=255), nullable=True))
    op.create_table(
        "sample_rewards",
        sa.Column("archive_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("component", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["archive_id"],
            ["archives.id"],
            name=op.f("fk_sample_rewards_archive_id_archives"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "archive_id", "position", "component", name=op.f("pk_sample_rewards")
        ),
        sqlite_with_rowid=False,
    )
    with op.batch_alter_table("archive_summaries") as batch_op:
        batch_op.add_column(sa.Column("unscored", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("reward_components", sa.JSON(), nullable=True))
    if not op.get_context().as_sql:
        from archive_manager.pool.summary import fill_missing_summaries

        # NOTE: the library's code writes today's summary tables: this must stay the last
        # revision to change them (a later one moves the fill there).
        fill_missing_summaries(op.get_bind())


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("archive_summaries") as batch_op:
        batch_op.drop_column("reward_components")
        batch_op.drop_column("unscored")
    op.drop_table("sample_rewards")
    with op.batch_alter_table("archives") as batch_op:
        batch_op.drop_column("reward_key")
