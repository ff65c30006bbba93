"""Arrow tables and JSON rows back into samples (this library's exports and other tables).

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.lazy_torch import torch_module
from ...codec.tensors import torch_dtypes
from ...errors import ArchiveError, UnsupportedFormatError
from ...samples import Sample, fields_to_sample, task_key_of
from .columns import field_name
from .common import _DTYPE, _MISSING, _NULL, RESERVED, SHAPE_SUFFIX, pyarrow_module
from .json_values import from_json_value
from .schemas import _kind_of
from .sharing import share_places

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class ImportedRow:
    """One row of a table read back: the sample, its task key and its archive's facts."""

    sample: Any
    task_key: str | None
    archive: str | None
    rollout_id: int | None
    evaluation: bool | None
    attrs: dict[str, Any] | None
    #: What the catalog records instead of what the sample object says: a foreign row without
    #: a status or a response length has none (a `Sample` built from it says "pending" and 0,
    #: its class defaults, which no catalog should present as facts).
    facts: dict[str, Any] | None = None


def is_export(names: Iterable[str]) -> bool:
    """Whether columns (or JSONL keys) ``names`` are those of this library's exports."""
    return {"archive", "position", "sample_class"} <= set(names)


def rows_to_samples(
    batch: pa.RecordBatch,
    *,
    mapping: dict[str, str] | None = None,
    where: str = "the table",
    first_row: int = 0,
) -> Iterator[ImportedRow]:
    """The samples of a record batch: this library's exports rebuilt as they were saved;
    other tables' rows as `Sample` s (``Sample.from_dict`` of the row, columns renamed by
    ``mapping``: ``{sample field: column}``).  Errors name rows counted from ``first_row``
    (the batch's first row in its file)."""
    schema = batch.schema
    ours = is_export(schema.names)
    decoded: dict[str, list[Any]] = {}
    for field in schema:
        name = field.name
        kind = _kind_of(field)
        if kind == b"shape":
            continue
        column = batch.column(name)
        if kind == b"json":
            # a null in a JSON column is a field the sample lacks; None is the text "null"
            values = [
                _MISSING
                if t is None
                else _json_cell(t, f"{where}, row {first_row + i}, column {name!r}")
                for i, t in enumerate(column.to_pylist())
            ]
        elif kind in (b"tensor", b"ndarray"):
            values = _read_tensors(batch, field, kind)
        elif ours and _is_number_list(field.type):
            values = _read_number_lists(column)
        else:
            values = column.to_pylist()
        if (field.metadata or {}).get(_NULL) == b"absent":
            values = [
                _MISSING if v is None and not m else v
                for v, m in zip(values, _valid(column), strict=True)
            ]
        decoded[name] = values
    for i in range(batch.num_rows):
        row = {name: values[i] for name, values in decoded.items()}
        yield imported_row(row, ours, mapping, f"{where}, row {first_row + i}")


def _json_cell(text: str, where: str) -> Any:
    """A JSON column's cell decoded; the file is untrusted input, so text that is not JSON,
    nests past the parser's stack or holds an int past Python's digit limit is named."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UnsupportedFormatError(f"{where} is not JSON text: {exc}") from None
    try:
        return from_json_value(value)
    except UnsupportedFormatError as exc:
        raise UnsupportedFormatError(f"{where}: {exc}") from None


def _valid(column: Any) -> list[bool]:
    return [v.is_valid for v in column]


def _is_number_list(t: Any) -> bool:
    pa = pyarrow_module()
    number_list: bool = (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)
    )
    return number_list


def _read_number_lists(column: Any) -> list[Any]:
    flat = column.flatten().to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    wide = flat.astype(np.int64 if flat.dtype.kind in "iu" else np.float64)
    out: list[Any] = []
    for i in range(len(column)):
        out.append(wide[offsets[i] : offsets[i + 1]].tolist() if valid[i] else None)
    return out


def _read_tensors(batch: Any, field: Any, kind: bytes) -> list[Any]:
    column = batch.column(field.name)
    shapes = batch.column(field.name + SHAPE_SUFFIX).to_pylist()
    dtype = field.metadata[_DTYPE].decode()
    flat = column.flatten().to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy()
    out: list[Any] = []
    for i, shape in enumerate(shapes):
        if shape is None:
            out.append(None)
            continue
        part = flat[offsets[i] : offsets[i + 1]].reshape(shape).copy()
        if kind == b"ndarray":
            out.append(part.astype(np.dtype(dtype), copy=False))
        else:
            torch = torch_module()
            out.append(torch.from_numpy(part).to(torch_dtypes()[dtype]))
    return out


def imported_row(
    row: dict[str, Any], ours: bool, mapping: dict[str, str] | None, where: str
) -> ImportedRow:
    if not ours:
        fields = {k: v for k, v in row.items() if v is not _MISSING}
        for target, source in (mapping or {}).items():
            if source in fields:
                fields[target] = fields.pop(source)
        status = fields.get("status")
        if status is not None and not isinstance(status, str):
            raise UnsupportedFormatError(f"{where}: status {status!r:.40} is not text")
        try:
            sample = Sample.from_dict(fields)
        except (TypeError, ValueError) as exc:
            raise UnsupportedFormatError(f"{where} does not fit a Sample: {exc}") from None
        facts = {key: None for key in ("status", "response_length") if fields.get(key) is None}
        # a task_key column (or one mapped to it) is the task key, as a save reads it
        return ImportedRow(sample, task_key_of(sample), None, None, None, None, facts or None)
    fields = {}
    for name, value in row.items():
        if name in RESERVED or value is _MISSING:
            continue
        fields[field_name(name)] = value
    shared = row.get("sample_shared")
    if shared is not None and shared is not _MISSING:
        share_places(fields, shared, where)
    converted = row.get("sample_converted")
    attrs = row.get("archive_attrs")
    attrs = None if attrs is _MISSING else attrs
    try:
        sample = fields_to_sample(
            row.get("sample_class"),
            fields,
            None if converted is None else [c for c in converted.split(",") if c],
        )
    except ArchiveError as exc:
        raise UnsupportedFormatError(f"{where}: {exc}") from None
    return ImportedRow(
        sample,
        row.get("task_key"),
        row.get("archive"),
        row.get("rollout_id"),
        row.get("evaluation"),
        attrs,
    )
