"""Whole tables and streams: key-only schemas, JSONL rows, conformed batches, column selection.

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError, UnencodableError
from .columns import build_batch, column_name
from .common import (
    _JSON_TAIL,
    _KIND,
    KEY_COLUMNS,
    SHAPE_SUFFIX,
    TAIL_COLUMNS,
    ArchiveSource,
    SchemaDrift,
    pyarrow_module,
)
from .json_values import to_json_value
from .reading import archive_batches, iter_chunk_rows
from .schemas import conform, json_columns, widened
from .sharing import shared_places

if TYPE_CHECKING:
    import pyarrow as pa


def key_schema() -> pa.Schema:
    """The schema of a selection without rows: the key and tail columns."""
    pa = pyarrow_module()
    types = [pa.string(), pa.int64(), pa.string(), pa.string(), pa.int64(), pa.bool_()]
    fields = [pa.field(n, t) for n, t in zip(KEY_COLUMNS, types, strict=True)]
    fields += [
        pa.field(n, pa.string(), metadata={_KIND: b"json"} if n in _JSON_TAIL else None)
        for n in TAIL_COLUMNS
    ]
    return pa.schema(fields)


def json_rows(source: ArchiveSource) -> Iterator[dict[str, Any]]:
    """The archive's rows as JSON objects (the JSONL export): the columns of `build_batch`,
    a field's value as `to_json_value` (a tensor whole, tagged), one chunk held at a time."""
    attrs = None if source.attrs is None else to_json_value(source.attrs)
    for rows in iter_chunk_rows(source):
        for r in rows:
            out: dict[str, Any] = {
                "archive": source.name,
                "position": r.position,
                "sample_key": r.sample_key,
                "task_key": r.task_key,
                "rollout_id": source.rollout_id,
                "evaluation": source.evaluation,
            }
            for key, value in r.fields.items():
                if type(key) is not str:
                    raise UnencodableError(
                        f"archive {source.name!r}, sample {r.position}: a field named by a "
                        f"{type(key).__name__} cannot be a JSON key"
                    )
                try:
                    out[column_name(key)] = to_json_value(value)
                except UnencodableError as exc:
                    raise UnencodableError(
                        f"archive {source.name!r}, sample {r.position}, field {key!r}: {exc}"
                    ) from None
            out["archive_attrs"] = attrs
            out["sample_class"] = r.cls
            out["sample_converted"] = None if r.converted is None else ",".join(r.converted)
            out["sample_shared"] = shared_places(r.fields)
            yield out


def empty_batch(source: ArchiveSource) -> pa.RecordBatch:
    """A batch with no row: the key and tail columns only."""
    return build_batch(source, [])


def conformed_batches(
    make: Callable[[frozenset[str]], Iterator[pa.RecordBatch]],
    restart: Callable[[], None] | None = None,
) -> tuple[pa.Schema | None, list[pa.RecordBatch]]:
    """Every batch of ``make(force_json)`` cast to one schema, kept in memory.

    A later batch that does not fit the schema so far starts it all again with both merged
    (a column of two kinds becomes JSON): rare, and each restart widens the schema.
    """
    schema: pa.Schema | None = None
    force: frozenset[str] = frozenset()
    while True:
        batches: list[pa.RecordBatch] = []
        try:
            for batch in make(force):
                if schema is None:
                    schema = batch.schema
                batches.append(conform(batch, schema))
        except SchemaDrift as drift:
            assert schema is not None
            schema = widened(schema, drift)
            force = json_columns(schema)
            if restart is not None:
                restart()
            continue
        return schema, batches


def check_columns(columns: Sequence[str] | None) -> None:
    """Raises `InvalidInputError` unless ``columns`` is None or a list of column names."""
    if columns is not None and (
        isinstance(columns, str) or not all(isinstance(c, str) for c in columns)
    ):
        raise InvalidInputError("columns must be a list of column names")


def selected_names(schema: pa.Schema, columns: Sequence[str]) -> list[str]:
    """The names of ``columns`` in ``schema``, in the order asked for, each tensor column's
    shape column right after it (unless asked for itself).

    Raises:
        InvalidInputError: a column the schema does not have (the message lists them).
    """
    check_columns(columns)
    names = schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise InvalidInputError(
            f"no column {', '.join(map(repr, missing))}; the columns are {', '.join(names)}"
        )
    wanted: dict[str, None] = {}
    for column in columns:
        wanted[column] = None
        shape = column + SHAPE_SUFFIX
        if shape in names and shape not in columns:
            wanted[shape] = None
    return list(wanted)


def select_columns(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    """The batch's ``columns``, in that order (see `selected_names`).

    Raises:
        InvalidInputError: a column the batch does not have (the message lists them).
    """
    if columns is None:
        return batch
    return batch.select(selected_names(batch.schema, columns))


def archive_table(source: ArchiveSource, columns: Sequence[str] | None = None) -> pa.Table:
    """`Archive.to_arrow`: the whole archive as one table; with ``columns``, those columns,
    read as `archive_batches` reads them (only what they need)."""
    pa = pyarrow_module()
    check_columns(columns)
    schema, batches = conformed_batches(
        lambda force: archive_batches(source, columns=columns, force_json=force)
    )
    if schema is None:
        batches = [empty_batch(source)]
        schema = batches[0].schema
    table = pa.Table.from_batches(batches, schema=schema)
    if columns is None:
        return table
    if any(c not in schema.names for c in columns):
        # the message lists the columns a whole read has (rare: a misspelt name)
        whole = archive_table(source) if batches[0].num_rows else table
        return whole.select(selected_names(whole.schema, columns))
    return table.select(selected_names(schema, columns))
