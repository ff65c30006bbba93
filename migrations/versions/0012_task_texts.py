"""The whole text of task keys that are the digest of a long text.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07

A task key is a catalog column of 255 characters, and a real prompt is often longer: it was
refused.  A text over 255 UTF-8 bytes is now keyed by ``sha256:`` and its digest (one text,
one key, in every archive: `samples.task_key_and_text`), and ``task_texts`` keeps the text of
each such key of an archive, to show it (``groups``, ``prompts``, the viewer).  Archives saved
before have no such key, so the table starts empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``task_texts``."""
    op.create_table(
        "task_texts",
        sa.Column("archive_id", sa.Integer(), nullable=False),
        sa.Column("task_key", sa.String(length=255), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["archive_id"],
            ["archives.id"],
            name=op.f("fk_task_texts_archive_id_archives"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("archive_id", "task_key", name=op.f("pk_task_texts")),
    )
    with op.batch_alter_table("task_texts") as batch_op:
        batch_op.create_index(batch_op.f("ix_task_texts_task_key"), ["task_key"], unique=False)


def downgrade() -> None:
    """Drop ``task_texts``."""
    op.drop_table("task_texts")
