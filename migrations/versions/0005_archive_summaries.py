"""Per-archive summaries for the statistics, and the archive index listings page through.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

``archive_summaries`` holds what the statistics need of each archive's samples, computed once
(docs/architecture/summaries-and-paging.md, "Summaries and paging"): ``stats`` over N archives reads
N small rows instead of every sample.  The summary of every archive already in the catalog is
computed from its sample rows when the upgrade reaches revision 0011 (one pass, in the upgrade's
transaction); an upgrade emitted as SQL text (``alembic upgrade --sql``) cannot, and the
statistics then compute the missing ones from the sample rows on every call, as before.

``ix_archives_state_rollout_id`` becomes ``(state, rollout_id, name)``: listings and the
sample-query walk read archives in that order, page by page, without a sort.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``archive_summaries`` (filled for every archive) and widen the archive index."""
    op.create_table(
        "archive_summaries",
        sa.Column("archive_id", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.Column("rewarded", sa.Integer(), nullable=False),
        sa.Column("reward_mean", sa.Float(), nullable=True),
        sa.Column("reward_min", sa.Float(), nullable=True),
        sa.Column("reward_max", sa.Float(), nullable=True),
        sa.Column("reward_p50", sa.Float(), nullable=True),
        sa.Column("reward_p90", sa.Float(), nullable=True),
        sa.Column("measured", sa.Integer(), nullable=False),
        sa.Column("length_mean", sa.Float(), nullable=True),
        sa.Column("length_min", sa.Float(), nullable=True),
        sa.Column("length_max", sa.Float(), nullable=True),
        sa.Column("length_p50", sa.Float(), nullable=True),
        sa.Column("length_p90", sa.Float(), nullable=True),
        sa.Column("groups", sa.Integer(), nullable=False),
        sa.Column("zero_variance_groups", sa.Integer(), nullable=False),
        sa.Column("group_stds", sa.Integer(), nullable=False),
        sa.Column("group_std_mean", sa.Float(), nullable=True),
        sa.Column("reward_sketch", sa.LargeBinary(), nullable=False),
        sa.Column("length_sketch", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["archive_id"],
            ["archives.id"],
            name=op.f("fk_archive_summaries_archive_id_archives"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("archive_id", name=op.f("pk_archive_summaries")),
    )
    with op.batch_alter_table("archives") as batch_op:
        batch_op.drop_index(batch_op.f("ix_archives_state_rollout_id"))
        batch_op.create_index(
            batch_op.f("ix_archives_state_rollout_id_name"),
            ["state", "rollout_id", "name"],
            unique=False,
        )
    # NOTE: the summaries of the archives already here are computed by revision 0011, the
    # last to change these tables: the library's code writes today's tables, not this
    # revision's.


def downgrade() -> None:
    """Drop ``archive_summaries``; the archive index is ``(state, rollout_id)`` again."""
    with op.batch_alter_table("archives") as batch_op:
        batch_op.drop_index(batch_op.f("ix_archives_state_rollout_id_name"))
        batch_op.create_index(
            batch_op.f("ix_archives_state_rollout_id"), ["state", "rollout_id"], unique=False
        )
    op.drop_table("archive_summaries")
