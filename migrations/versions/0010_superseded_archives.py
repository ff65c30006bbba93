"""A name may be saved again: archive names are unique among current archives only.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-08

``pool.save(name, ..., supersede=True)`` saves a step again under a name whose archive was
released; the earlier archive stays on record as ``superseded`` (``superseded_by``: the id
of the archive that took its name, ``superseded_at``: when), and only the archive the name
points at counts (docs/architecture/save-protocol.md, "Superseding a name").  So ``archives.name``
is no longer unique: two partial unique indexes take its place, one over the archives a name points
at (``published``, ``released``) and one over pending saves (a superseding save's pending row
stands beside the released archive it replaces until it publishes), with a plain index for
lookups.  The state check gains ``superseded``.

SQLite rebuilds ``archives`` ("move and copy", in the upgrade's transaction, foreign keys off:
see ``catalog.migrate.migration_connection``); its AUTOINCREMENT counter is carried over, so
no id of a deleted archive is handed out again.  Every row keeps its id and its values.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

_OLD_STATES = "state IN ('pending', 'published', 'released')"
_NEW_STATES = "state IN ('pending', 'published', 'released', 'superseded')"
_CURRENT = "state IN ('published', 'released')"
_PENDING = "state = 'pending'"


def _where(condition: str) -> dict[str, object]:
    return {"sqlite_where": sa.text(condition), "postgresql_where": sa.text(condition)}


def _sqlite_sequence() -> int | None:
    """The AUTOINCREMENT counter of ``archives`` (SQLite), which a rebuild would lower to the
    highest id left."""
    if op.get_context().dialect.name != "sqlite" or op.get_context().as_sql:
        return None
    return (
        op.get_bind()
        .exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = 'archives'")
        .scalar()
    )


def _restore_sequence(seq: int | None) -> None:
    if seq is None:
        return
    bind = op.get_bind()
    updated = bind.exec_driver_sql(
        "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'archives'", (seq,)
    ).rowcount
    if not updated:
        bind.exec_driver_sql(
            "INSERT INTO sqlite_sequence (name, seq) VALUES ('archives', ?)", (seq,)
        )


def upgrade() -> None:
    """Add ``superseded_by``/``superseded_at`` and the ``superseded`` state; name unique among
    current archives and among pending saves."""
    seq = _sqlite_sequence()
    with op.batch_alter_table(
        "archives", recreate="auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.add_column(sa.Column("superseded_by", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("superseded_at", sa.Float(), nullable=True))
        batch_op.drop_constraint(batch_op.f("ck_archives_state"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_archives_state"), sa.text(_NEW_STATES))
        batch_op.drop_constraint(batch_op.f("uq_archives_name"), type_="unique")
        batch_op.create_index(batch_op.f("ix_archives_name"), ["name"], unique=False)
        batch_op.create_index("ix_archives_name_current", ["name"], unique=True, **_where(_CURRENT))
        batch_op.create_index("ix_archives_name_pending", ["name"], unique=True, **_where(_PENDING))
    _restore_sequence(seq)


def downgrade() -> None:
    """Back to a unique name (fails while a name has a superseded archive: drop those rows
    first) and the three states."""
    seq = _sqlite_sequence()
    with op.batch_alter_table(
        "archives", recreate="auto", table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.drop_index("ix_archives_name_pending")
        batch_op.drop_index("ix_archives_name_current")
        batch_op.drop_index(batch_op.f("ix_archives_name"))
        batch_op.create_unique_constraint(batch_op.f("uq_archives_name"), ["name"])
        batch_op.drop_constraint(batch_op.f("ck_archives_state"), type_="check")
        batch_op.create_check_constraint(batch_op.f("ck_archives_state"), sa.text(_OLD_STATES))
        batch_op.drop_column("superseded_at")
        batch_op.drop_column("superseded_by")
    _restore_sequence(seq)
