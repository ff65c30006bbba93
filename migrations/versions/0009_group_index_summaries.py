"""Prompt groups by ``group_index``: the summaries of archives with samples without task keys
are computed again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

The statistics' prompt-group figures (``archive_summaries.groups``, ``zero_variance_groups``,
``group_stds``, ``group_std_mean``) counted only samples with a task key, while ``groups``
grouped a sample without one by its ``group_index`` (slime marks a prompt's completions so
and saves no task key): ``stats`` and ``groups`` disagreed on the same archive.  A save now
counts groups by the one rule (`pool.summary.group_key_of`); this revision deletes the
summaries of every archive holding a sample without a task key, and revision 0011 computes
them again from the sample rows, with those of the archives that had none (a catalog older
than revision 0005; revision 0007 filled them before, with the tables of its day).  An
upgrade emitted as SQL text cannot compute them; the statistics then compute the missing
ones on every call.
"""

from __future__ import annotations

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Delete the summaries grouped by task key alone (revision 0011 fills them)."""
    # NOTE: the library's code writes today's summary tables: the fill is done by revision
    # 0011, the last to change them.
    from archive_manager.pool.summary import drop_untasked_summaries

    if not op.get_context().as_sql:
        drop_untasked_summaries(op.get_bind())


def downgrade() -> None:
    """Nothing to undo: the summaries stay as computed (an older library reads them)."""
