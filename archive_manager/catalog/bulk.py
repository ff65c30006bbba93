"""Bulk inserts of many rows (entries, sample metadata) with bounded memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any

from sqlalchemy import JSON, Table, insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

__all__ = ["insert_rows"]

_COPY_MIN_ROWS = 512


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
    SQLite it hands tuples straight to the driver's ``executemany`` (measured: 100k entry
    rows in 0.27 s instead of 0.38 s, as SQLAlchemy builds no per-row parameter dict), and
    it consumes ``rows`` in batches so a generator of a million rows is never all in memory.
    On PostgreSQL (psycopg) it streams many rows with ``COPY``; fewer rows, and other
    databases, get Core ``INSERT``s in batches.

    Args:
        conn: A connection inside a write transaction.
        table: The target table, e.g. `entries_table`.
        columns: Column names, in the order of each row's values.
        rows: The rows; any iterable, consumed once.
        batch_size: Rows per ``executemany`` call.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    unknown = [name for name in columns if name not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column(s) {', '.join(unknown)}")
    iterator = iter(rows)
    total = 0
    if conn.dialect.name == "sqlite":
        dialect = conn.dialect
        compiled = insert(table).compile(dialect=dialect, column_keys=list(columns))
        # The compiled statement lists columns in table order; map each row onto it.
        order = [list(columns).index(key) for key in compiled.positiontup or ()]
        processors = [
            table.c[columns[i]].type.dialect_impl(dialect).bind_processor(dialect) for i in order
        ]
        plain = order == list(range(len(columns))) and not any(processors)
        sql = str(compiled)
        while batch := list(islice(iterator, batch_size)):
            if not plain:
                batch = [_arranged(row, order, processors) for row in batch]
            conn.exec_driver_sql(sql, batch)
            total += len(batch)
        return total
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
        first = list(islice(iterator, _COPY_MIN_ROWS))
        if len(first) == _COPY_MIN_ROWS:
            return _copy_rows(conn, table, columns, chain(first, iterator))
        iterator = iter(first)
    statement = insert(table)
    while batch := list(islice(iterator, batch_size)):
        conn.execute(statement, [dict(zip(columns, row, strict=True)) for row in batch])
        total += len(batch)
    return total


def _copy_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterator[Sequence[Any]]
) -> int:
    """PostgreSQL: ``COPY ... FROM STDIN`` in the open transaction.

    NOTE: measured, 100k entry rows take 0.68 s instead of 1.1 s with Core's batched
    INSERT ... VALUES; below `_COPY_MIN_ROWS` rows the INSERT wins, being one round trip
    where COPY needs two (and a save holds the write lock meanwhile).
    """
    import psycopg

    dialect = conn.dialect
    serialize = getattr(dialect, "_json_serializer", None) or json.dumps
    json_columns = [i for i, name in enumerate(columns) if isinstance(table.c[name].type, JSON)]
    preparer = dialect.identifier_preparer
    sql = (
        f"COPY {preparer.format_table(table)} "
        f"({', '.join(preparer.quote(name) for name in columns)}) FROM STDIN"
    )
    raw = conn.connection.dbapi_connection
    total = 0
    try:
        with raw.cursor() as cursor, cursor.copy(sql) as copy:  # type: ignore[union-attr]
            for row in rows:
                if json_columns:
                    row = list(row)
                    for i in json_columns:
                        if row[i] is not None:
                            row[i] = serialize(row[i])
                copy.write_row(row)
                total += 1
    except psycopg.Error as exc:
        # The same exception classes as every other statement (IntegrityError, ...).
        raise DBAPIError.instance(sql, None, exc, psycopg.Error) from exc
    return total


def _arranged(
    row: Sequence[Any],
    order: list[int],
    processors: list[Callable[[Any], Any] | None],
) -> tuple[Any, ...]:
    return tuple(
        value if processor is None else processor(value)
        for value, processor in zip((row[i] for i in order), processors, strict=True)
    )
