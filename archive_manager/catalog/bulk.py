"""Bulk inserts of many rows (entries, sample metadata) with bounded memory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Connection

from .engine import dialect_named

__all__ = ["insert_rows"]


def insert_rows(
    conn: Connection,
    table: Table,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    batch_size: int = 50_000,
) -> int:
    """Insert ``rows`` (tuples in ``columns`` order) into ``table``; return how many.

    ``conn.execute(insert(table), [dict, ...])`` is correct too; this is its fast path. On
    SQLite it hands tuples straight to the driver (measured: 100k entry rows in 0.27 s
    instead of Core's 0.38 s, as SQLAlchemy builds no per-row parameter dict), up to 256
    rows a statement (one step of the driver, which lets go of the GIL at each: 0.28 ->
    0.23 s), and it consumes ``rows`` in batches so a generator of a million rows is never
    all in memory.
    On PostgreSQL (psycopg) it streams many rows with ``COPY``; fewer rows get Core
    ``INSERT``s in batches.  Each is its dialect's ``bulk_insert`` (`catalog.dialects`).

    Args:
        conn: A connection inside a write transaction.
        table: The target table, e.g. `entries_table`.
        columns: Column names, in the order of each row's values.
        rows: The rows; any iterable, consumed once.
        batch_size: Rows taken from ``rows`` at a time (and per ``COPY`` or driver call).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    unknown = [name for name in columns if name not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column(s) {', '.join(unknown)}")
    return dialect_named(conn.dialect.name).bulk_insert(
        conn, table, columns, iter(rows), batch_size
    )
