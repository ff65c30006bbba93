"""Archives as Arrow record batches, and Arrow tables back into samples
(docs/architecture.md, "Getting data out").

One row per sample: the keys and facts the catalog knows (`KEY_COLUMNS`), then one column per
sample field.  Numeric list fields become list columns of the narrowest exact type, built
from the arrays the records store (`StoredNumbers`: no Python object per number); lists of
strings become string list columns; a tensor or numpy array field becomes its values,
flattened, with a ``<field>.shape`` column beside; nested and mixed fields become JSON text
(`to_json_value`).  pyarrow is imported by the functions that need it, never at import.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import select

from .._util.lazy_torch import is_tensor, torch_module
from ..catalog import chunks_table, entries_table
from ..codec import ChunkReader, StoredNumbers, TensorRef
from ..codec import values as codec_values
from ..codec.tensors import torch_dtype_names, torch_dtypes
from ..codec.values import _narrow_ints_dtype, gc_paused
from ..errors import (
    ArchiveError,
    IntegrityError,
    InvalidInputError,
    MissingDependencyError,
    UnencodableError,
    UnsupportedFormatError,
    extra_hint,
)
from ..samples import (
    Sample,
    enum_to_record,
    fields_to_sample,
    record_to_enum,
    record_to_value,
    task_key_of,
    value_to_record,
)
from .context import PoolContext

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

__all__ = [
    "KEY_COLUMNS",
    "ArchiveSource",
    "SchemaDrift",
    "archive_batches",
    "conform",
    "from_json_value",
    "merge_schemas",
    "pyarrow_module",
    "rows_to_samples",
    "to_json_value",
]

#: The columns every exported row starts with: where the sample is and what its archive is.
KEY_COLUMNS = ("archive", "position", "sample_key", "task_key", "rollout_id", "evaluation")
#: The columns every exported row ends with: what an import needs to rebuild the sample.
TAIL_COLUMNS = ("archive_attrs", "sample_class", "sample_converted", "sample_shared")
RESERVED = frozenset(KEY_COLUMNS + TAIL_COLUMNS)
#: A sample field whose name is reserved (slime's ``rollout_id``, a ``task_key`` attribute)
#: gets this prefix; so does one that starts with it, so the mapping stays reversible.
FIELD_PREFIX = "field."
SHAPE_SUFFIX = ".shape"

# Arrow field metadata: how a column's values are read back.
_KIND = b"archive_manager.kind"  # json, tensor, ndarray, shape
_DTYPE = b"archive_manager.dtype"  # a tensor column's torch or numpy dtype
_NULL = b"archive_manager.null"  # "absent": a null is a field the sample lacks (not a None)
_TAG = "$t"
_FLOAT_BITS = struct.Struct("<d")
# NOTE: Python refuses to write or read an int of more digits than this in decimal (by
# default; sys.set_int_max_str_digits), so json.dumps raised a bare ValueError on an int the
# codec stores (tagged): past it an int is written as a tagged hex string.
_JSON_INT_LIMIT = 10**sys.int_info.default_max_str_digits
_MISSING: Any = object()
_INT64 = (-(2**63), 2**63 - 1)
# the tail columns holding JSON text (a JSON value in JSONL)
_JSON_TAIL = frozenset(("archive_attrs", "sample_shared"))


def pyarrow_module() -> Any:
    """pyarrow, imported on first use.

    Raises:
        MissingDependencyError: it is not installed (the ``data`` extra).
    """
    try:
        import pyarrow
    except ImportError as exc:
        raise MissingDependencyError(
            "Arrow, Parquet, pandas and dataset exports need pyarrow; " + extra_hint("data")
        ) from exc
    return pyarrow


@dataclass(frozen=True)
class ArchiveSource:
    """What reading an archive's rows needs (`Archive.arrow_source` makes one)."""

    context: PoolContext
    archive_id: int
    name: str
    rollout_id: int | None
    evaluation: bool
    attrs: dict[str, Any] | None
    read_blob: Callable[[str, str], bytes]
    load_tensor: Callable[[str], torch.Tensor]


@dataclass
class Row:
    position: int
    sample_key: str
    task_key: str | None
    cls: str | None
    fields: dict[str, Any]
    converted: list[str] | None


class SchemaDrift(ArchiveError, ValueError):
    """A batch's columns do not fit the schema of the batches before it."""

    def __init__(self, message: str, schema: pa.Schema) -> None:
        super().__init__(message)
        self.schema = schema


# --------------------------------------------------------------------------- reading


#: One chunk's part of a read: ``(ordinal, digest, [(position, sample_key, task_key, offset)])``.
ChunkPlan = tuple[int, str, list[tuple[int, str, str | None, int]]]


def chunk_plan(source: ArchiveSource, positions: Iterable[int] | None = None) -> list[ChunkPlan]:
    """The chunks holding the archive's samples (or those at ``positions``), in archive
    order, each with its entries: the catalog alone."""
    e, c = entries_table, chunks_table
    with source.context.catalog.read() as conn:
        entries = conn.execute(
            select(e.c.position, e.c.sample_key, e.c.task_key, e.c.chunk_ordinal, e.c.offset)
            .where(e.c.archive_id == source.archive_id)
            .order_by(e.c.position)
        ).all()
        digests = dict(
            conn.execute(
                select(c.c.ordinal, c.c.digest).where(c.c.archive_id == source.archive_id)
            ).all()
        )
    wanted = None if positions is None else set(positions)
    plan: list[ChunkPlan] = []
    for position, skey, tkey, ordinal, offset in entries:
        if wanted is not None and position not in wanted:
            continue
        if not plan or plan[-1][0] != ordinal:
            digest = digests.get(ordinal)
            if digest is None:
                raise IntegrityError(f"archive {source.name!r} has no row for chunk {ordinal}")
            plan.append((ordinal, digest, []))
        plan[-1][2].append((position, skey, tkey, offset))
    return plan


def fetch_chunk(source: ArchiveSource, part: ChunkPlan) -> ChunkReader:
    """Read, check and inflate one chunk's records (no decoding: it releases the GIL)."""
    ordinal, digest, entries = part
    reader = ChunkReader(
        source.read_blob(digest, f"chunk {ordinal}"), digest=digest, loader=source.load_tensor
    )
    reader.inflate([offset for *_, offset in entries])
    return reader


def decode_chunk_rows(source: ArchiveSource, part: ChunkPlan, reader: ChunkReader) -> list[Row]:
    """The records of one fetched chunk, decoded (numeric lists as `StoredNumbers`)."""
    ordinal = part[0]
    rows = []
    with gc_paused():
        for position, skey, tkey, offset in part[2]:
            try:
                cls, fields, converted = reader.record(offset)
            except (IndexError, IntegrityError) as exc:
                raise IntegrityError(
                    f"archive {source.name!r}, chunk {ordinal} (blob {reader.digest}): {exc}"
                ) from exc
            rows.append(Row(position, skey, tkey, cls, fields, converted))
    return rows


def iter_chunk_rows(
    source: ArchiveSource, positions: Iterable[int] | None = None
) -> Iterator[list[Row]]:
    """The archive's samples (or those at ``positions``) as decoded records, a chunk at a
    time, in archive order; the next chunk is read and inflated while this one is used, so
    at most two chunks are held (as `Archive.load_samples` reads)."""
    plan = chunk_plan(source, positions)
    if not plan:
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="archive-export")
    try:
        ahead: Future[ChunkReader] = pool.submit(fetch_chunk, source, plan[0])
        for k, part in enumerate(plan):
            reader = ahead.result()
            if k + 1 < len(plan):
                ahead = pool.submit(fetch_chunk, source, plan[k + 1])
            yield decode_chunk_rows(source, part, reader)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def archive_batches(
    source: ArchiveSource,
    *,
    positions: Iterable[int] | None = None,
    columns: Sequence[str] | None = None,
    force_json: frozenset[str] = frozenset(),
) -> Iterator[pa.RecordBatch]:
    """One record batch per chunk read (each with its own inferred types; see `conform`)."""
    for rows in iter_chunk_rows(source, positions):
        batch = build_batch(source, rows, force_json=force_json)
        yield batch if columns is None else batch.select(list(columns))


# --------------------------------------------------------------------------- columns


def column_name(field: str) -> str:
    """The column of sample field ``field`` (reserved names get `FIELD_PREFIX`)."""
    if field in RESERVED or field.startswith(FIELD_PREFIX) or field.endswith(SHAPE_SUFFIX):
        return FIELD_PREFIX + field  # a field "x.shape" must not take a tensor x's shape column
    return field


def field_name(column: str) -> str:
    """Inverse of `column_name`."""
    return column[len(FIELD_PREFIX) :] if column.startswith(FIELD_PREFIX) else column


def build_batch(
    source: ArchiveSource, rows: list[Row], *, force_json: frozenset[str] = frozenset()
) -> pa.RecordBatch:
    """The rows of one chunk as a record batch."""
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
    tail = [
        ([attrs] * n, "archive_attrs"),
        ([r.cls for r in rows], "sample_class"),
        (
            [None if r.converted is None else ",".join(r.converted) for r in rows],
            "sample_converted",
        ),
        ([_shared_text(r.fields) for r in rows], "sample_shared"),
    ]
    for values, name in tail:
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


def _torch_dtype_name(value: Any) -> str:
    return torch_dtype_names()[value.dtype]


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
    """``values`` in the narrowest dtype that holds each exactly (docs/architecture.md,
    "Getting data out": the column type is the narrowest over all its rows)."""
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


def _tensor_numpy(value: Any) -> np.ndarray:
    tensor = value.materialize() if isinstance(value, TensorRef) else value
    torch = torch_module()
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()  # exact: every bfloat16 is a float32
    try:
        return tensor.numpy()
    except TypeError as exc:  # complex32, float8...: no numpy dtype
        raise UnencodableError(f"a {tensor.dtype} tensor has no Arrow type ({exc})") from None


# --------------------------------------------------------------------------- JSON


def to_json_value(value: Any) -> Any:
    """``value`` as plain JSON, tagged (``{"$t": ...}``) where JSON would lose it: tuples,
    mappings with keys other than text, non-finite floats, ints of more than 4,300 digits
    (Python's default limit on decimal ints), tensors and numpy values.

    One tensor or array held in several places (it loads as one object) is written out at
    each place, so the bytes written again count against the save's own expansion bound
    (docs/architecture.md, "Samples and values"): what the save bounded stays bounded here.

    Raises:
        UnencodableError: a value JSON cannot hold even tagged (a complex number), or one
            whose repeated tensors would write more than the bound again.
    """
    return _to_json(value, _Repeats())


class _Repeats:
    """The tensors and arrays one `to_json_value` call wrote, and the bytes written again."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.extra = 0

    def add(self, value: Any, nbytes: int) -> None:
        if id(value) not in self.seen:
            self.seen.add(id(value))
            return
        self.extra += nbytes
        limit = codec_values._MAX_EXTRA_BYTES
        if self.extra > limit:
            raise UnencodableError(
                f"a tensor held in many places would be written out again past {limit:,} "
                "bytes: a table export writes it at each place (export_pt keeps it once)"
            )


def _to_json(value: Any, repeats: _Repeats) -> Any:
    t = type(value)
    if t is int:
        if -_JSON_INT_LIMIT < value < _JSON_INT_LIMIT:
            return value
        return {_TAG: "int", "v": hex(value)}
    if value is None or t is bool or t is str:
        return value
    if t is float:
        if math.isfinite(value):
            return value
        return {_TAG: "float", "v": _FLOAT_BITS.pack(value).hex()}
    if t is list:
        return [_to_json(v, repeats) for v in value]
    if t is StoredNumbers:
        # nan and +-inf (a -inf log-prob is ordinary) need their tag; finite lists stay fast
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return [_to_json(v, repeats) for v in value.tolist()]
        return value.tolist()
    if t is dict:
        if _TAG not in value and all(type(k) is str for k in value):
            return {k: _to_json(v, repeats) for k, v in value.items()}
        return {
            _TAG: "map",
            "v": [[_to_json(k, repeats), _to_json(v, repeats)] for k, v in value.items()],
        }
    if t is tuple:
        return {_TAG: "tuple", "v": [_to_json(v, repeats) for v in value]}
    if isinstance(value, TensorRef) or is_tensor(value):
        array = _tensor_numpy(value)
        repeats.add(value, array.nbytes)
        return {
            _TAG: "tensor",
            "d": _torch_dtype_name(value),
            "sh": list(array.shape),
            "v": _to_json(array.reshape(-1).tolist(), repeats),
        }
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufU":
        repeats.add(value, value.nbytes)
        flat = _to_json(value.reshape(-1).tolist(), repeats)
        return {_TAG: "ndarray", "d": value.dtype.str, "sh": list(value.shape), "v": flat}
    if isinstance(value, np.ndarray) and value.dtype.kind == "S":
        repeats.add(value, value.nbytes)
        flat = [base64.b64encode(v).decode("ascii") for v in value.reshape(-1).tolist()]
        return {_TAG: "ndarray", "d": value.dtype.str, "sh": list(value.shape), "v": flat}
    if isinstance(value, np.ndarray) and value.dtype == object:
        items = [_to_json(v, repeats) for v in value.reshape(-1).tolist()]
        return {_TAG: "ndobj", "sh": list(value.shape), "v": items}
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {_TAG: "npscalar", "d": value.dtype.str, "v": _to_json(value.item(), repeats)}
    if t is np.str_:
        return {_TAG: "npstr", "v": str(value)}
    if t is np.bytes_:
        return {_TAG: "npbytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if t is bytes or t is bytearray:
        return {_TAG: t.__name__, "v": base64.b64encode(value).decode("ascii")}
    if t.__module__.startswith("PIL.") and codec_values._pil_image_class(value) is not None:
        return _image_json(value, repeats)
    if isinstance(value, enum.Enum):
        name, raw = enum_to_record(value)
        return {_TAG: "enum", "c": name, "v": _to_json(raw, repeats)}
    if dataclasses.is_dataclass(t):
        name, fields = value_to_record(value)
        return {_TAG: "obj", "c": name, "f": _to_json(fields, repeats)}
    raise UnencodableError(f"a {t.__name__} has no JSON form")


def _image_json(image: Any, repeats: _Repeats) -> dict[str, Any]:
    """A PIL image as the pool stores it (`codec.values`): mode, size, palette, info, pixels."""
    node: dict[str, Any] = {
        _TAG: "image",
        "m": image.mode,
        "sz": list(image.size),
        "v": base64.b64encode(image.tobytes()).decode("ascii"),
    }
    if image.mode in ("P", "PA") and image.getpalette() is not None:
        node["p"] = image.getpalette()
    if image.info:
        node["i"] = _to_json(dict(image.info), repeats)
    return node


def from_json_value(value: Any) -> Any:
    """Inverse of `to_json_value`."""
    t = type(value)
    if t is list:
        return [from_json_value(v) for v in value]
    if t is not dict:
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: from_json_value(v) for k, v in value.items()}
    try:
        if tag == "float":
            return _FLOAT_BITS.unpack(bytes.fromhex(value["v"]))[0]
        if tag == "int":
            if type(value["v"]) is not str:
                raise TypeError("its value is not text")
            return int(value["v"], 16)  # linear in its length, unlike decimal
        if tag == "map":
            return {_hashable(from_json_value(k)): from_json_value(v) for k, v in value["v"]}
        if tag == "tuple":
            return tuple(from_json_value(v) for v in value["v"])
        if tag == "tensor":
            dtype = torch_dtypes()[value["d"]]
            flat = torch_module().tensor(from_json_value(value["v"]), dtype=dtype)
            return flat.reshape(value["sh"])
        if tag == "ndarray":
            dtype = np.dtype(value["d"])
            if dtype.kind not in "biufcUS":
                raise TypeError(f"dtype {dtype} is no array the pool stores as values")
            if dtype.kind == "S":
                flat = [base64.b64decode(v, validate=True) for v in value["v"]]
            else:
                flat = from_json_value(value["v"])
            return np.array(flat, dtype=dtype).reshape(value["sh"])
        if tag == "ndobj":
            items = [from_json_value(v) for v in value["v"]]
            out = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                out[i] = item  # item by item: nested lists stay items, not dimensions
            return out.reshape(value["sh"])
        if tag == "npstr":
            if type(value["v"]) is not str:
                raise TypeError("its value is not text")
            return np.str_(value["v"])
        if tag == "npbytes":
            return np.bytes_(base64.b64decode(value["v"], validate=True))
        if tag == "npscalar":
            return np.dtype(value["d"]).type(from_json_value(value["v"]))
        if tag in ("bytes", "bytearray"):
            data = base64.b64decode(value["v"], validate=True)
            return data if tag == "bytes" else bytearray(data)
        if tag == "image":
            pixels = memoryview(base64.b64decode(value["v"], validate=True))
            node = {k: v for k, v in value.items() if k not in ("v", "i")}
            image = codec_values._decode_image(node, pixels, from_json_value)
            if "i" in value:
                image.info.update(from_json_value(value["i"]))
            return image
        if tag == "enum" and type(value["c"]) is str:
            return record_to_enum(value["c"], from_json_value(value["v"]))
        if tag == "obj" and type(value["c"]) is str and type(value["f"]) is dict:
            return record_to_value(value["c"], from_json_value(value["f"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise UnsupportedFormatError(f"a malformed {tag!r:.20} value: {exc}") from None
    raise UnsupportedFormatError(f"an unknown tagged value {tag!r:.40}")


def _hashable(key: Any) -> Any:
    if type(key) is list:  # a JSON array stands for nothing hashable we wrote
        raise UnsupportedFormatError("a mapping key is a list")
    return key


# --------------------------------------------------------------------------- schemas


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
        if _kind_of(own) != _kind_of(field) or (
            column.null_count and _null_means_absent(own) != _null_means_absent(field)
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
    )


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


# --------------------------------------------------------------------------- import


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


# --------------------------------------------------------------------------- sharing


def shared_places(fields: dict[str, Any]) -> list[list[list[Any]]] | None:
    """The places of each tensor or numpy array that a sample's fields hold more than once
    (it loads as one object: docs/architecture.md, "Samples and values"), for the
    ``sample_shared`` column: ``[[place, place, ...], ...]``, a place being the field name
    then a step per container, a list's or tuple's index or a dict's item ordinal (its keys
    may be anything a mapping key can be).  None when nothing is held twice.

    NOTE: every place still holds the whole value, so a reader that knows nothing of this
    column (pandas, DuckDB, datasets) reads every place; the column only lets an import
    give the places one object again (`share_places`).
    """
    places: dict[int, list[list[Any]]] = {}
    stack: list[tuple[Any, list[Any]]] = [(v, [k]) for k, v in reversed(fields.items())]
    while stack:
        value, place = stack.pop()
        t = type(value)
        if t is list or t is tuple or t is dict:
            items = value.values() if t is dict else value
            inner = [
                (v, [*place, i])
                for i, v in enumerate(items)
                if type(v) not in _LEAVES  # strings and numbers: nothing to share
            ]
            stack.extend(reversed(inner))
        elif t is np.ndarray or t is TensorRef or is_tensor(value):
            places.setdefault(id(value), []).append(place)
    groups = [group for group in places.values() if len(group) > 1]
    return groups or None


_LEAVES = frozenset((str, int, float, bool, type(None), StoredNumbers))


def _shared_text(fields: dict[str, Any]) -> str | None:
    groups = shared_places(fields)
    return None if groups is None else json.dumps(groups)


def share_places(fields: dict[str, Any], groups: Any, where: str) -> None:
    """Make the places each group of ``groups`` (`shared_places`) names hold one object, in
    ``fields`` as read from a table.

    A place in a field the row lacks (a column left out) is skipped.  The table's values
    win: places that do not hold the same tensor or array (dtype, shape and bits; an edited
    table) are refused rather than made one, and so is a malformed column.

    Raises:
        UnsupportedFormatError: a malformed ``sample_shared`` value, a place that holds no
            tensor or array, or places of one group holding different values.
    """
    if type(groups) is not list or not all(type(g) is list for g in groups):
        raise UnsupportedFormatError(f"{where}: sample_shared is not a list of place lists")
    # NOTE: a dict's step is an ordinal; its keys (which `_put` never changes) are listed
    # once per dict, not once per place: a column naming places in a 100,000-item dict
    # 4,000 times took 14 s for a 1.6 MB table (quadratic).  The dict is kept with its
    # keys, so its id cannot be reused meanwhile.
    keys: dict[int, tuple[dict[Any, Any], list[Any]]] = {}
    for group in groups:
        found: list[tuple[list[Any], Any]] = []
        seen: set[str] = set()
        for place in group:
            if type(place) is not list or not place or type(place[0]) is not str:
                raise UnsupportedFormatError(f"{where}: sample_shared holds a malformed place")
            text = _place_text(place)
            if text in seen:
                continue  # named again: nothing more to look up, compare or put
            seen.add(text)
            if place[0] in fields:
                found.append((place, _at_place(fields[place[0]], place, where, keys)))
        if len(found) < 2:
            continue
        first = found[0][1]
        for place, value in found[1:]:
            if value is not first and not _same_data(first, value):
                raise UnsupportedFormatError(
                    f"{where}: sample_shared says {_place_text(found[0][0])} and "
                    f"{_place_text(place)} hold one value, but they differ (an edited "
                    "table?); drop the sample_shared column to import them as separate values"
                )
        for place, _ in found[1:]:
            fields[place[0]] = _put(fields[place[0]], place[1:], first, keys)


def _place_text(place: list[Any]) -> str:
    return repr(place[0]) + "".join(f"[{step!r}]" for step in place[1:])


def _dict_keys(
    value: dict[Any, Any], keys: dict[int, tuple[dict[Any, Any], list[Any]]]
) -> list[Any]:
    known = keys.get(id(value))
    if known is None:
        known = keys[id(value)] = (value, list(value))
    return known[1]


def _at_place(
    value: Any,
    place: list[Any],
    where: str,
    keys: dict[int, tuple[dict[Any, Any], list[Any]]],
) -> Any:
    for step in place[1:]:
        t = type(value)
        size = len(value) if t is dict or t is list or t is tuple else -1
        if type(step) is not int or not 0 <= step < size:
            raise UnsupportedFormatError(
                f"{where}: sample_shared names {_place_text(place)}, which the row lacks"
            )
        value = value[_dict_keys(value, keys)[step]] if t is dict else value[step]
    if not (type(value) is np.ndarray or is_tensor(value)):
        raise UnsupportedFormatError(
            f"{where}: sample_shared names {_place_text(place)}, which holds no tensor or array"
        )
    return value


def _put(
    container: Any,
    steps: list[Any],
    obj: Any,
    keys: dict[int, tuple[dict[Any, Any], list[Any]]],
) -> Any:
    """``container`` with ``obj`` at ``steps`` (a tuple on the way is built again)."""
    if not steps:
        return obj
    step, rest = steps[0], steps[1:]
    t = type(container)
    if t is dict:
        key = _dict_keys(container, keys)[step]
        container[key] = _put(container[key], rest, obj, keys)
        return container
    if t is tuple:
        items = list(container)
        items[step] = _put(items[step], rest, obj, keys)
        return tuple(items)
    container[step] = _put(container[step], rest, obj, keys)
    return container


def _same_data(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one type of value holding the same dtype, shape and bits."""
    if type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if type(a) is np.ndarray:
        return bool(a.tobytes() == b.tobytes())
    torch = torch_module()
    bits = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return bool(torch.equal(bits[0], bits[1]))


# --------------------------------------------------------------------------- tables


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
            schema = drift.schema
            force = json_columns(schema)
            if restart is not None:
                restart()
            continue
        return schema, batches


def select_columns(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    """The batch's ``columns`` (a tensor's shape column comes with it).

    Raises:
        InvalidInputError: a column the batch does not have (the message lists them).
    """
    if columns is None:
        return batch
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidInputError("columns must be a list of column names")
    names = batch.schema.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise InvalidInputError(
            f"no column {', '.join(map(repr, missing))}; the columns are {', '.join(names)}"
        )
    wanted = [
        n
        for n in names
        if n in columns or (n.endswith(SHAPE_SUFFIX) and n[: -len(SHAPE_SUFFIX)] in columns)
    ]
    return batch.select(wanted)


def archive_table(source: ArchiveSource, columns: Sequence[str] | None = None) -> pa.Table:
    """`Archive.to_arrow`: the whole archive as one table."""
    pa = pyarrow_module()
    schema, batches = conformed_batches(lambda force: archive_batches(source, force_json=force))
    if schema is None:
        batches = [empty_batch(source)]
        schema = batches[0].schema
    table = pa.Table.from_batches(batches, schema=schema)
    if columns is None:
        return table
    return table.select(select_columns(batches[0], columns).schema.names)
