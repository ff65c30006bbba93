"""Records as Arrow columns: a column per sample field, its kind read from the batch's values.

(docs/architecture/getting-data-out.md, "Getting data out".)
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._util.lazy_torch import is_tensor
from ...codec import StoredNumbers, TensorRef
from ...codec.values import _narrow_ints_dtype
from ...errors import UnencodableError
from .common import (
    _DTYPE,
    _INT64,
    _JSON_TAIL,
    _KIND,
    _MISSING,
    _NULL,
    FIELD_PREFIX,
    KEY_COLUMNS,
    RESERVED,
    SHAPE_SUFFIX,
    ArchiveSource,
    Row,
    _tensor_numpy,
    _torch_dtype_name,
    pyarrow_module,
)
from .json_values import to_json_value
from .sharing import _shared_text

if TYPE_CHECKING:
    import pyarrow as pa


def column_name(field: str) -> str:
    """The column of sample field ``field`` (reserved names get `FIELD_PREFIX`)."""
    if field in RESERVED or field.startswith(FIELD_PREFIX) or field.endswith(SHAPE_SUFFIX):
        return FIELD_PREFIX + field  # a field "x.shape" must not take a tensor x's shape column
    return field


def field_name(column: str) -> str:
    """Inverse of `column_name`."""
    return column[len(FIELD_PREFIX) :] if column.startswith(FIELD_PREFIX) else column


def build_batch(
    source: ArchiveSource,
    rows: list[Row],
    *,
    force_json: frozenset[str] = frozenset(),
    tail: bool = True,
) -> pa.RecordBatch:
    """The rows of one chunk as a record batch (without the `TAIL_COLUMNS` unless ``tail``:
    a read of some columns that needs none of them)."""
    pa = pyarrow_module()
    n = len(rows)
    names: dict[str, None] = {}
    for row in rows:
        for key in row.fields:
            if type(key) is not str:
                raise UnencodableError(
                    f"archive {source.name!r}, sample {row.position}: a field named by a "
                    f"{type(key).__name__} ({key!r:.40}) cannot be a column"
                )
            names.setdefault(key)
    attrs = None if source.attrs is None else json.dumps(to_json_value(source.attrs))
    arrays: list[Any] = [
        pa.array([source.name] * n, pa.string()),
        pa.array([r.position for r in rows], pa.int64()),
        pa.array([r.sample_key for r in rows], pa.string()),
        pa.array([r.task_key for r in rows], pa.string()),
        pa.array([source.rollout_id] * n, pa.int64()),
        pa.array([source.evaluation] * n, pa.bool_()),
    ]
    fields: list[Any] = [pa.field(k, a.type) for k, a in zip(KEY_COLUMNS, arrays, strict=True)]
    for key in names:
        column = column_name(key)
        values = [r.fields.get(key, _MISSING) for r in rows]
        try:
            for field, array in _field_columns(pa, column, values, column in force_json):
                fields.append(field)
                arrays.append(array)
        except UnencodableError as exc:
            raise UnencodableError(
                f"archive {source.name!r}, sample field {key!r}: {exc} (export as .jsonl, or "
                "leave the field out)"
            ) from None
        except UnicodeEncodeError:
            raise UnencodableError(
                f"archive {source.name!r}, sample field {key!r} holds text with a lone "
                "surrogate, which Arrow strings (UTF-8) cannot hold; export as .jsonl"
            ) from None
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise UnencodableError(
                f"archive {source.name!r}, sample field {key!r} cannot be typed: {exc}"
            ) from None
    tails = [
        ([attrs] * n, "archive_attrs"),
        ([r.cls for r in rows], "sample_class"),
        (
            [None if r.converted is None else ",".join(r.converted) for r in rows],
            "sample_converted",
        ),
        ([_shared_text(r.fields) for r in rows], "sample_shared"),
    ]
    for values, name in tails if tail else ():
        meta = {_KIND: b"json"} if name in _JSON_TAIL else None
        fields.append(pa.field(name, pa.string(), metadata=meta))
        arrays.append(pa.array(values, pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _kind(value: Any) -> str:
    t = type(value)
    if value is None:
        return "none"
    if t is bool:
        return "bool"
    if t is int:
        return "int" if _INT64[0] <= value <= _INT64[1] else "json"
    if t is float:
        return "float"
    if t is str:
        return "str"
    if t is StoredNumbers:
        return "floats" if value.dtype.kind == "f" else "ints"
    if t is list:
        if not value:
            return "empty"
        return "strs" if all(type(v) is str for v in value) else "json"
    if isinstance(value, TensorRef) or is_tensor(value):
        return f"tensor:{_torch_dtype_name(value)}"
    if t is np.ndarray and value.dtype.kind in "biuf":
        return f"ndarray:{value.dtype.str}"
    return "json"


def _field_columns(
    pa: Any, column: str, values: list[Any], force_json: bool
) -> list[tuple[Any, Any]]:
    present = [v for v in values if v is not _MISSING]
    absent = len(present) < len(values)
    kinds = {_kind(v) for v in present}
    typed = kinds - {"none"}
    if force_json or (absent and "none" in kinds) or len(typed) > 2:
        return [_json_column(pa, column, values)]
    meta = {_NULL: b"absent"} if absent else None
    mask = [v is None or v is _MISSING for v in values]
    if not typed:
        return [(pa.field(column, pa.null(), metadata=meta), pa.nulls(len(values)))]
    scalar = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    if len(typed) == 1 and (kind := next(iter(typed))) in scalar:
        array = pa.array(
            [None if m else v for v, m in zip(values, mask, strict=True)], scalar[kind]
        )
        return [(pa.field(column, array.type, metadata=meta), array)]
    lists = typed - {"empty"}
    if len(lists) == 1 and (kind := next(iter(lists))) in ("ints", "floats", "strs"):
        return [_list_column(pa, column, values, mask, kind, meta)]
    if len(typed) == 1 and kind.startswith(("tensor:", "ndarray:")):
        return _tensor_columns(pa, column, values, mask, kind, meta)
    return [_json_column(pa, column, values)]


def _json_column(pa: Any, column: str, values: list[Any]) -> tuple[Any, Any]:
    texts = [None if v is _MISSING else json.dumps(to_json_value(v)) for v in values]
    field = pa.field(column, pa.string(), metadata={_KIND: b"json"})
    return field, pa.array(texts, pa.string())


def _offsets(lengths: list[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _list_column(
    pa: Any, column: str, values: list[Any], mask: list[bool], kind: str, meta: Any
) -> tuple[Any, Any]:
    items = [() if m else v for v, m in zip(values, mask, strict=True)]
    offsets = _offsets([len(v) for v in items])
    if kind == "strs":
        flat = pa.array([s for v in items for s in v], pa.string())
    else:
        arrays = [np.asarray(v) for v in items if len(v)]
        flat_np = np.concatenate(arrays) if arrays else np.zeros(0, np.int8)
        flat = pa.array(_narrowest(flat_np, kind))
    array = pa.ListArray.from_arrays(
        pa.array(offsets), flat, mask=pa.array(mask, pa.bool_()) if any(mask) else None
    )
    return pa.field(column, array.type, metadata=meta), array


def _narrowest(values: np.ndarray, kind: str) -> np.ndarray:
    """``values`` in the narrowest dtype that holds each exactly
    (docs/architecture/getting-data-out.md, "Getting data out": the column type is the narrowest
    over all its rows)."""
    if kind == "ints":
        return values.astype(_narrow_ints_dtype(values), copy=False)
    if values.dtype == np.float32:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        singles = values.astype(np.float32)
    if np.array_equal(singles.astype(np.float64).view(np.int64), values.view(np.int64)):
        return singles
    return values


def _tensor_columns(
    pa: Any, column: str, values: list[Any], mask: list[bool], kind: str, meta: Any
) -> list[tuple[Any, Any]]:
    dtype = kind.split(":", 1)[1]
    flats: list[np.ndarray] = []
    shapes: list[list[int] | None] = []
    for value, m in zip(values, mask, strict=True):
        if m:
            shapes.append(None)
            continue
        array = _tensor_numpy(value) if kind.startswith("tensor:") else value
        shapes.append(list(array.shape))
        flats.append(np.ascontiguousarray(array).reshape(-1))
    offsets = _offsets([0 if s is None else math.prod(s) for s in shapes])
    flat = np.concatenate(flats) if flats else np.zeros(0, np.int8)
    null = pa.array(mask, pa.bool_()) if any(mask) else None
    data = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), mask=null)
    tag = b"tensor" if kind.startswith("tensor:") else b"ndarray"
    field_meta = {**(meta or {}), _KIND: tag, _DTYPE: dtype.encode()}
    shape = pa.array(shapes, pa.list_(pa.int64()))
    shape_meta = {**(meta or {}), _KIND: b"shape"}
    return [
        (pa.field(column, data.type, metadata=field_meta), data),
        (pa.field(column + SHAPE_SUFFIX, shape.type, metadata=shape_meta), shape),
    ]
