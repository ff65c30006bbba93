"""Record the process that holds a save's lease.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07

``leases.holder`` is ``{"host", "pid", "start"}`` (the process's start time, Linux only), so a
new save of a name held by a pending save can tell a crashed save (its process gone, on this
host) from one in flight, roll the crashed one back and proceed (docs/architecture/save-protocol.md,
"Save protocol").  Leases taken before the upgrade have none and are waited out as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Add ``leases.holder`` (null for GC's leases and those taken before)."""
    with op.batch_alter_table("leases") as batch_op:
        batch_op.add_column(sa.Column("holder", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop ``leases.holder``."""
    with op.batch_alter_table("leases") as batch_op:
        batch_op.drop_column("holder")
