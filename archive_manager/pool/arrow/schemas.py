"""One schema per stream: casting a batch to the schema so far, merging schemas when it cannot.

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .common import _KIND, _NULL, SHAPE_SUFFIX, SchemaDrift, pyarrow_module
from .json_values import to_json_value

if TYPE_CHECKING:
    import pyarrow as pa


def _kind_of(field: Any) -> bytes | None:
    return (field.metadata or {}).get(_KIND)


def _null_means_absent(field: Any) -> bool:
    return (field.metadata or {}).get(_NULL) == b"absent" or _kind_of(field) == b"json"


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (the schema of the batches before it): columns put in
    its order, those it lacks filled with nulls where a null means an absent field.

    Raises:
        SchemaDrift: a column of another kind (JSON, tensor), nulls that mean another thing,
            a column the schema lacks, or a value the schema's type cannot hold;
            ``.schema`` is `merge_schemas` of both.
    """
    pa = pyarrow_module()
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    have = {f.name: f for f in batch.schema}
    arrays = []
    unfit = next((n for n in have if n not in schema.names), None)
    for field in schema if unfit is None else ():
        own = have.get(field.name)
        if own is None or pa.types.is_null(own.type):
            base = field.name[: -len(SHAPE_SUFFIX)] if _kind_of(field) == b"shape" else None
            base_null = base is not None and (base not in have or pa.types.is_null(have[base].type))
            if own is None and not (_null_means_absent(field) or base_null):
                unfit = field.name
                break
            if own is not None and _kind_of(field) == b"json":
                arrays.append(_as_json_text(batch.column(field.name), _null_means_absent(own)))
            elif own is not None and _null_means_absent(own) != _null_means_absent(field):
                unfit = field.name
                break
            else:
                arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(field.name)
        if _kind_of(field) == b"json" and _kind_of(own) is None:
            arrays.append(_as_json_text(column, _null_means_absent(own)))
            continue
        # NOTE: Arrow casts ints to bools (3 -> True) and bools to ints without complaint
        if (
            _kind_of(own) != _kind_of(field)
            or _has_bool(own.type) != _has_bool(field.type)
            or (column.null_count and _null_means_absent(own) != _null_means_absent(field))
        ):
            unfit = field.name
            break
        try:
            arrays.append(column.cast(field.type) if column.type != field.type else column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            unfit = field.name
            break
    if unfit is None:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    nulls = {f.name for f, c in zip(batch.schema, batch.columns, strict=True) if c.null_count}
    raise SchemaDrift(
        f"column {unfit!r} of a later chunk does not fit the type the first chunks gave it "
        '(pass schema="scan", or this error\'s .schema, as schema=)',
        merge_schemas(schema, batch.schema, nulls),
        unfit,
    )


def _has_bool(kind: Any) -> bool:
    """Whether Arrow type ``kind`` holds bools (itself, or its items' or fields' types)."""
    pa = pyarrow_module()
    if pa.types.is_boolean(kind):
        return True
    return any(_has_bool(kind.field(i).type) for i in range(kind.num_fields))


def _as_json_text(column: Any, null_is_absent: bool) -> Any:
    """A typed column's values as the JSON text a JSON column holds (a JSON column wider
    than a typed one: a field that is text in one chunk and chat messages in another)."""
    pa = pyarrow_module()
    texts = [
        None if v is None and null_is_absent else json.dumps(to_json_value(v))
        for v in column.to_pylist()
    ]
    return pa.array(texts, pa.string())


def stream_schema(first: pa.Schema) -> pa.Schema:
    """The schema of a stream that starts with a batch of schema ``first``: its columns
    that hold only nulls become JSON, which takes whatever later chunks hold there."""
    pa = pyarrow_module()
    return pa.schema(
        [
            pa.field(f.name, pa.string(), metadata={_KIND: b"json"})
            if pa.types.is_null(f.type)
            else f
            for f in first
        ]
    )


def merge_schemas(first: pa.Schema, later: pa.Schema, later_nulls: set[str]) -> pa.Schema:
    """One schema holding the batches of both: numeric types promoted, a column whose kinds
    (or whose nulls' meanings) differ made JSON, a column only one has made nullable as an
    absent field, columns of either in their first order."""
    pa = pyarrow_module()
    json_field = {_KIND: b"json"}
    fields: dict[str, Any] = {f.name: f for f in first}
    for field in later:
        known = fields.get(field.name)
        if known is None:
            absent = _null_means_absent(field) or field.name not in later_nulls
            fields[field.name] = (
                field.with_metadata({**(field.metadata or {}), _NULL: b"absent"})
                if absent and _kind_of(field) != b"json"
                else field
                if absent
                else pa.field(field.name, pa.string(), metadata=json_field)
            )
            continue
        if _kind_of(known) == _kind_of(field) and (
            field.name not in later_nulls or _null_means_absent(known) == _null_means_absent(field)
        ):
            try:
                merged = pa.unify_schemas(
                    [pa.schema([known]), pa.schema([field])], promote_options="permissive"
                )
                fields[field.name] = merged.field(0).with_metadata(known.metadata)
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
        fields[field.name] = pa.field(field.name, pa.string(), metadata=json_field)
    for name in set(first.names) - set(later.names):
        field = fields[name]
        if not _null_means_absent(field):
            fields[name] = field.with_metadata({**(field.metadata or {}), _NULL: b"absent"})
    out = []
    for name, field in fields.items():
        # a tensor field made JSON takes its shape column with it
        base = name[: -len(SHAPE_SUFFIX)] if name.endswith(SHAPE_SUFFIX) else None
        if base in fields and _kind_of(field) == b"shape" and _kind_of(fields[base]) == b"json":
            continue
        out.append(field)
    return pa.schema(out)


def json_columns(schema: pa.Schema) -> frozenset[str]:
    """The columns of ``schema`` that hold JSON text."""
    return frozenset(f.name for f in schema if _kind_of(f) == b"json")


def widened(schema: pa.Schema, drift: SchemaDrift) -> pa.Schema:
    """The schema to start again in after ``drift`` of the batches of ``schema``: both
    merged, or where merging widens nothing (an int past 2**53 among floats: promoted to
    float64, it drifts back) the column that did not fit made JSON, so that every restart
    widens the schema and the restarts end.

    Raises:
        SchemaDrift: ``drift`` itself, where no column can be made wider.
    """
    if not drift.schema.equals(schema, check_metadata=True):
        return drift.schema
    column = drift.column
    if column is None or column not in schema.names or _kind_of(schema.field(column)) == b"json":
        raise drift
    return with_json_column(schema, column)


def with_json_column(schema: pa.Schema, name: str) -> pa.Schema:
    """``schema`` with column ``name`` made JSON (a tensor's shape column names its tensor,
    whose shape column goes with it): for a column whose values a promoted type cannot hold
    (an int past 2**53 in a float64 column)."""
    pa = pyarrow_module()
    field = schema.field(name)
    if _kind_of(field) == b"shape":
        name = name[: -len(SHAPE_SUFFIX)]
    json_field = pa.field(name, pa.string(), metadata={_KIND: b"json"})
    return pa.schema(
        [json_field if f.name == name else f for f in schema if f.name != name + SHAPE_SUFFIX]
    )
