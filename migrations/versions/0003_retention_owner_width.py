"""Widen ``retention.owner`` so that every archive's own owner fits.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

An archive retains its blobs as ``archive:<name>``, and names may be 255 UTF-8 bytes (up to
255 characters), so the owner needs 263 characters. SQLite never enforced the old
``VARCHAR(255)``; PostgreSQL does, and refused the longest names. The table holds one row per
owner and archive, so SQLite's batch "move and copy" of it is cheap.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """``retention.owner``: VARCHAR(255) -> VARCHAR(512)."""
    with op.batch_alter_table("retention") as batch_op:
        batch_op.alter_column(
            "owner", existing_type=sa.String(length=255), type_=sa.String(length=512)
        )


def downgrade() -> None:
    """``retention.owner``: back to VARCHAR(255) (fails on PostgreSQL if a longer one exists)."""
    with op.batch_alter_table("retention") as batch_op:
        batch_op.alter_column(
            "owner", existing_type=sa.String(length=512), type_=sa.String(length=255)
        )
