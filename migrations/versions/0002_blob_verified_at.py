"""Record when ``verify --read-data`` last rehashed each blob.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Lets a verify pass skip blobs rehashed recently and report how stale each check is.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``blobs.verified_at`` (UTC epoch seconds, null until first verified)."""
    with op.batch_alter_table("blobs") as batch_op:
        batch_op.add_column(sa.Column("verified_at", sa.Float(), nullable=True))


def downgrade() -> None:
    """Drop ``blobs.verified_at``."""
    with op.batch_alter_table("blobs") as batch_op:
        batch_op.drop_column("verified_at")
