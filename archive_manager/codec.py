"""Samples <-> chunk bytes, tensor blobs and manifests.  No catalog, no file I/O, no pickle.

Chunk blob layout (little-endian)::

    magic "AMCHUNK\\0" | version u16 | flags u16 | n u32 | n x (offset u64, stored u64, raw u64,
    method u8, pad 7) | records...

Each record holds one sample: ``tree_len u32 | tree (JSON) | pad | arrays``, compressed with
zstd as a whole unless that does not pay.  The tree is the sample's fields as tagged JSON; the
bulky values (numeric lists, tensors, numpy arrays) are binary arrays after it, referenced by
offset.  Decoding one sample therefore touches only its own record: the index is at a fixed
place, so a reader can seek (or slice a memory map) straight to it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import marshal
import math
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import countOf
from typing import Any

import numpy as np
import torch
import zstandard

from ._digest import Buffer, check_digest, digest_of
from .errors import ArchiveError, IntegrityError, UnencodableError, UnsupportedFormatError
from .samples import fields_to_sample, sample_to_fields

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "ChunkReader",
    "EncodedChunk",
    "EncodedSample",
    "GilHandOver",
    "RawChunk",
    "TensorBlob",
    "TensorRef",
    "build_chunk",
    "decode_chunk",
    "decode_manifest",
    "decode_tensor_blob",
    "encode_chunk",
    "encode_manifest",
    "encode_sample",
    "encode_tensor_blob",
    "materialize_tensor_refs",
]

DEFAULT_INLINE_LIMIT = 1 << 20

CHUNK_MAGIC = b"AMCHUNK\x00"
TENSOR_MAGIC = b"AMTENSR\x00"
MANIFEST_MAGIC = b"AMMANIF\x00"
FORMAT_VERSION = 1

_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, count
_INDEX = struct.Struct("<QQQB7x")  # offset, stored length, raw length, method
_TREE_LEN = struct.Struct("<I")
_TENSOR_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, header length

_RAW, _ZSTD = 0, 1
# NOTE: the encoder only compresses a record when raw <= stored * _MAX_RATIO + _RATIO_SLACK, and
# the decoder rejects anything else: hostile bytes can then never make it allocate more than a
# bounded multiple of the blob they came in.
_MAX_RATIO = 4096
_RATIO_SLACK = 1 << 16
_ZSTD_LEVEL = 1
# Short numeric lists cost more as arrays (descriptor, alignment) than as JSON.
_MIN_ARRAY_LEN = 8
_ALIGN = 8
# Long text (responses, prompts) goes to the array section as UTF-8: it skips JSON escaping
# on the way in and out.
_MIN_RAW_STR = 512
_TAG = "$t"
# JSON keeps neither a NaN's sign and payload nor (past sys.get_int_max_str_digits(), at least
# 640 digits) an int: those few scalars are tagged.
_NAN_BITS = struct.Struct("<d")
_CANONICAL_NAN = _NAN_BITS.pack(math.nan)
_BIG_INT = 10**600
_NEG_BIG_INT = -_BIG_INT
# One rule for both sides: the encoder refuses what the decoder would refuse as corrupt.
_MAX_DIMS = 64
# NOTE: a sample is stored as a tree, so a sub-list, tuple or dict that it holds several times
# (a DAG, not a cycle) is written out once per path to it.  ``v = [v, v]`` repeated 40 times is
# 2**40 lists: past this many items written again for repeated containers, the save is refused
# (docs/architecture.md, "Samples and values").
_MAX_REPEATED_ITEMS = 1 << 20

# dtype names are part of the on-disk format: never reorder or rename.
_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex32",
    "float8_e8m0fnu",
)  # fmt: skip


def _numpy_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:
        return None  # torch-only (bfloat16, float8, complex32)


_TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)
}
_TORCH_DTYPE_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}
_NUMPY_DTYPES = {name: dtype for name in _DTYPE_NAMES if (dtype := _numpy_dtype(name)) is not None}
_INT_NARROWING = [
    (np.dtype(n), int(np.iinfo(n).min), int(np.iinfo(n).max))
    for n in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64")
]


class TensorRef:
    """A tensor stored as its own blob; loaded (and digest-checked) on first use.

    Shape and dtype are known without reading the blob, so metadata and viewers can describe
    it for free.  Torch functions, tensor methods and ``==`` materialize it transparently.
    """

    __slots__ = ("_loader", "_lock", "_tensor", "digest", "dtype", "nbytes", "shape")

    def __init__(
        self,
        digest: str,
        dtype: torch.dtype,
        shape: Sequence[int],
        nbytes: int,
        loader: Callable[[str], torch.Tensor] | None = None,
    ) -> None:
        self.digest = digest
        self.dtype = dtype
        self.shape = torch.Size(shape)
        self.nbytes = nbytes
        self._loader = loader
        self._tensor: torch.Tensor | None = None
        self._lock = threading.Lock()

    def materialize(self) -> torch.Tensor:
        """Load the tensor (once; later calls return the same tensor)."""
        with self._lock:
            if self._tensor is None:
                if self._loader is None:
                    raise ArchiveError(f"tensor blob {self.digest} has no loader attached")
                tensor = self._loader(self.digest)
                if tensor.dtype != self.dtype or tensor.shape != self.shape:
                    raise IntegrityError(
                        f"tensor blob {self.digest} holds {tensor.dtype}{list(tensor.shape)}, "
                        f"its reference says {self.dtype}{list(self.shape)}"
                    )
                self._tensor = tensor
            return self._tensor

    @property
    def loaded(self) -> bool:
        """Whether the blob has been read already."""
        return self._tensor is not None

    def dim(self) -> int:
        """Number of dimensions, without loading."""
        return len(self.shape)

    def numel(self) -> int:
        """Number of elements, without loading."""
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        """Like `torch.Tensor.size`, without loading."""
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:
        # Only reached for names TensorRef does not define: behave like the tensor.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.materialize()[key]

    def __eq__(self, other: object) -> Any:
        return self.materialize() == _materialized(other)

    def __ne__(self, other: object) -> Any:
        return self.materialize() != _materialized(other)

    __hash__ = None  # type: ignore[assignment]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.materialize().numpy()
        return arr if dtype is None else arr.astype(dtype)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None
    ) -> Any:
        return func(*_materialized(tuple(args)), **_materialized(kwargs or {}))

    def __repr__(self) -> str:
        return f"TensorRef({self.digest}, dtype={self.dtype}, shape={list(self.shape)})"


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: TensorRef, *args: Any) -> Any:
        return getattr(self.materialize(), name)(*_materialized(args))

    method.__name__ = name
    return method


# Operators are looked up on the type, not through __getattr__: give TensorRef the tensor's.
for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__lshift__", "__rshift__", "__lt__", "__le__", "__gt__", "__ge__",
    "__neg__", "__pos__", "__abs__", "__invert__", "__bool__", "__float__", "__int__",
    "__index__", "__iter__", "__contains__",
):  # fmt: skip
    setattr(TensorRef, _name, _delegate(_name))
del _name


_ATOMIC = frozenset({type(None), bool, int, float, str})


def _materialized(obj: Any) -> Any:
    # NOTE: containers are rebuilt only when a ref inside was replaced, and lists of plain
    # values (token ids, masks, log-probs: millions of items per rollout) are skipped in one
    # C-level pass; rebuilding every list item by item took 2.4 s for a 1024-sample rollout.
    if isinstance(obj, TensorRef):
        return obj.materialize()
    if isinstance(obj, (list, tuple)):
        if obj and type(obj[0]) in _ATOMIC and countOf(map(type, obj), type(obj[0])) == len(obj):
            return obj
        items = [_materialized(v) for v in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        values = {k: _materialized(v) for k, v in obj.items()}
        if all(values[k] is v for k, v in obj.items()):
            return obj
        return values
    return obj


def materialize_tensor_refs(obj: Any) -> Any:
    """Return ``obj`` with every `TensorRef` inside replaced by its tensor.

    Lists, tuples and dicts that hold a ref are rebuilt (others are returned as they are);
    dataclass samples are updated in place (their attributes, extras included) and returned.
    """
    if isinstance(obj, (TensorRef, tuple, list, dict)):
        return _materialized(obj)
    attrs = getattr(obj, "__dict__", None)
    if attrs is not None and not isinstance(obj, type):
        for key, value in list(attrs.items()):
            new = _materialized(value)
            if new is not value:
                setattr(obj, key, new)
    return obj


# --------------------------------------------------------------------------------------------
# Encoding


@dataclass
class TensorBlob:
    """A tensor to be stored as its own blob: the parts to write and their digest."""

    digest: str
    parts: list[Buffer]
    size: int


@dataclass
class EncodedChunk:
    """A chunk blob ready to store, with the tensor blobs it references."""

    data: bytes
    digest: str
    samples: int
    tensor_blobs: dict[str, TensorBlob] = field(default_factory=dict)


class _Record:
    """Collects one sample's arrays while its tree is built."""

    __slots__ = ("arrays", "copy", "inline_limit", "size", "tensor_blobs")

    def __init__(
        self, inline_limit: int, tensor_blobs: dict[str, TensorBlob], *, copy: bool = False
    ) -> None:
        self.arrays: list[Buffer] = []
        self.size = 0
        self.inline_limit = inline_limit
        self.tensor_blobs = tensor_blobs
        # Everything else is copied into the record anyway; only a tensor blob's parts can
        # alias the caller's memory (see `encode_sample`).
        self.copy = copy

    def add(self, data: Buffer) -> tuple[int, int]:
        pad = -self.size % _ALIGN
        if pad:
            self.arrays.append(b"\0" * pad)
            self.size += pad
        offset = self.size
        nbytes = memoryview(data).nbytes
        self.arrays.append(data)
        self.size += nbytes
        return offset, nbytes

    def add_shuffled(self, arr: np.ndarray) -> dict[str, Any]:
        """Store a 1-d numeric array, byte-shuffled when wider than a byte (helps zstd)."""
        itemsize = arr.dtype.itemsize
        if itemsize > 1 and arr.size > 1:
            data = arr.view(np.uint8).reshape(-1, itemsize).T.tobytes()
            shuffled = True
        else:
            data = arr.tobytes()
            shuffled = False
        offset, nbytes = self.add(data)
        return {"o": offset, "n": nbytes, "s": shuffled}


def _tensor_bytes(t: torch.Tensor) -> tuple[torch.Tensor, memoryview]:
    """The tensor's raw bytes, without copying a contiguous CPU tensor."""
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise UnencodableError(f"cannot store a {kind} tensor; convert it to dense first")
    if t.dim() > _MAX_DIMS:
        raise UnencodableError(
            f"cannot store a tensor of {t.dim()} dimensions (at most {_MAX_DIMS})"
        )
    if t.is_quantized or t.dtype not in _TORCH_DTYPE_NAMES:
        raise UnencodableError(f"cannot store a tensor of dtype {t.dtype}")
    if t.device.type == "meta":
        raise UnencodableError("cannot store a tensor on the meta device: it holds no data")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # A lazy conj/neg view's memory is not its value; resolving is free when the bit is unset.
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.numel() == 0:
        return t, memoryview(b"")
    flat = t.reshape(-1)
    if flat.stride(0) != 1:
        # NOTE: a one-element view keeps its stride (t[::2][:1]) and still counts as
        # contiguous, but view(uint8) needs a unit stride.
        flat = flat.clone(memory_format=torch.contiguous_format)
    return t, memoryview(flat.view(torch.uint8).numpy()).cast("B")


def encode_tensor_blob(t: torch.Tensor) -> TensorBlob:
    """A tensor as a standalone blob: a small header, then its bytes as they are in memory."""
    t, raw = _tensor_bytes(t)
    header = json.dumps(
        {"dtype": _TORCH_DTYPE_NAMES[t.dtype], "shape": list(t.shape)}, separators=(",", ":")
    ).encode()
    header += b" " * (-(len(header) + _TENSOR_HEAD.size) % 64)
    head = _TENSOR_HEAD.pack(TENSOR_MAGIC, FORMAT_VERSION, 0, len(header)) + header
    parts: list[Buffer] = [head, raw]
    return TensorBlob(digest_of(parts), parts, len(head) + raw.nbytes)


def decode_tensor_blob(data: Buffer, digest: str = "?") -> torch.Tensor:
    """The tensor in a tensor blob, as a new writable tensor."""
    mv = memoryview(data).cast("B")
    try:
        magic, version, _flags, hlen = _TENSOR_HEAD.unpack_from(mv, 0)
        _check_magic(magic, TENSOR_MAGIC, version, f"tensor blob {digest}")
        start = _TENSOR_HEAD.size + hlen
        if start > mv.nbytes:
            raise IntegrityError("header runs past the end of the blob")
        header = json.loads(bytes(mv[_TENSOR_HEAD.size : start]))
        dtype = _TORCH_DTYPES[header["dtype"]]
        shape = _check_shape(header["shape"])
        return _tensor_from(mv[start:], dtype, shape, exact=True)
    except (ArchiveError, UnicodeDecodeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc


def _tensor_from(
    mv: memoryview, dtype: torch.dtype, shape: tuple[int, ...], *, exact: bool = False
) -> torch.Tensor:
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if nbytes > mv.nbytes or (exact and nbytes != mv.nbytes):
        raise IntegrityError(f"tensor of {nbytes} bytes does not fit {mv.nbytes} stored bytes")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    # bytearray: the tensor must own writable memory, not alias a read-only chunk or mmap.
    flat = torch.frombuffer(bytearray(mv[:nbytes]), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


class _Encoder:
    """Turns one sample's field values into a JSON tree plus binary arrays."""

    def __init__(self, record: _Record) -> None:
        self.record = record
        self.active: set[int] = set()
        # Containers met so far (all alive: the sample holds them while it is encoded) and the
        # items written again because a container was met again (see _MAX_REPEATED_ITEMS).
        self.seen: set[int] = set()
        self.repeated = 0

    def encode(self, value: Any) -> Any:
        t = type(value)
        if t is str:
            if len(value) >= _MIN_RAW_STR:
                offset, nbytes = self.record.add(value.encode("utf-8", "surrogatepass"))
                return {_TAG: "str", "o": offset, "n": nbytes}
            return value
        if value is None or t is bool:
            return value
        if t is int:
            if _NEG_BIG_INT < value < _BIG_INT:
                return value
            return {_TAG: "int", "v": hex(value)}
        if t is float:
            if value != value and _NAN_BITS.pack(value) != _CANONICAL_NAN:
                return {_TAG: "nan", "v": _NAN_BITS.pack(value).hex()}
            return value
        if t is list:
            return self._list(value)
        if t is dict:
            return self._dict(value)
        if t is tuple:
            return {_TAG: "tuple", "v": self._items(value)}
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, TensorRef):
            return self._tensor(value.materialize())
        if isinstance(value, np.ndarray) and not isinstance(value, np.ma.MaskedArray):
            return self._ndarray(value)
        if isinstance(value, np.generic) and value.dtype.name in _NUMPY_DTYPES:
            return {_TAG: "npscalar", "d": value.dtype.name, "v": self._ndarray_tree(value)}
        raise UnencodableError(
            f"cannot store a value of type {t.__module__}.{t.__qualname__}: samples may hold "
            "None, bool, int, float, str, lists/tuples/dicts of those, torch tensors and numpy "
            "arrays (register dataclass sample types with register_sample_class)"
        )

    def _enter(self, value: Any) -> None:
        key = id(value)
        if key in self.active:
            raise UnencodableError("a sample holds a reference cycle; it cannot be stored")
        self.active.add(key)
        if key in self.seen:
            self._count(value, key)
        else:
            self.seen.add(key)

    def _count(self, value: Any, key: int) -> None:
        """Count a container met again (its id is in ``seen``)."""
        self.repeated += len(value) + 1
        if self.repeated > _MAX_REPEATED_ITEMS:
            raise UnencodableError(
                "a sample holds the same lists, tuples or dicts so many times that storing "
                f"it would write more than {_MAX_REPEATED_ITEMS:,} items again (samples are "
                "stored as trees: a shared value is written once per place it appears)"
            )

    def _items(self, values: list | tuple) -> list[Any]:
        self._enter(values)
        item: Any = None
        try:
            return [self.encode(item := v) for v in values]
        except UnencodableError as exc:
            # The first item that is the failing one: encoding the same object fails alike.
            index = next(i for i, v in enumerate(values) if v is item)
            raise _at(exc, f"[{index}]") from None
        finally:
            self.active.discard(id(values))

    def _dict(self, value: dict, *, top: bool = False) -> Any:
        self._enter(value)
        key: Any = None
        try:
            # NOTE: ``key :=`` keeps the key being encoded for the error message below
            if _TAG not in value and all(type(k) is str for k in value):
                return {(key := k): self.encode(v) for k, v in value.items()}
            return {
                _TAG: "map",
                "v": [[self._key(key := k), self.encode(v)] for k, v in value.items()],
            }
        except UnencodableError as exc:
            raise _at(exc, _key_text(key) if top else f"[{_key_text(key)}]") from None
        except RecursionError:
            if not top:
                raise
            # converted here, at the top, where the stack has room again
            deep = UnencodableError("the value is nested too deeply to be stored")
            raise _at(deep, _key_text(key)) from None
        finally:
            self.active.discard(id(value))

    def _key(self, key: Any) -> Any:
        """A mapping key: what decodes to an equal, hashable key."""
        t = type(key)
        if t is tuple:
            self._enter(key)
            try:
                return {_TAG: "tuple", "v": [self._key(k) for k in key]}
            finally:
                self.active.discard(id(key))
        if isinstance(key, (torch.Tensor, TensorRef)):
            # NOTE: a tensor hashes by identity, so a loaded copy would never equal the key
            # it replaces (and a lazy ref above the inline limit is not hashable at all).
            raise UnencodableError("a tensor cannot be stored as a mapping key")
        return self.encode(key)

    def _list(self, value: list) -> Any:
        if len(value) >= _MIN_ARRAY_LEN:
            node = self._array(value)
            if node is not None:
                key = id(value)
                if key in self.seen:
                    self._count(value, key)
                else:
                    self.seen.add(key)
                return node
        return self._items(value)

    def _array(self, value: list) -> dict[str, Any] | None:
        """A numeric list as one binary array, or None when it is not one."""
        fast = _marshalled_numbers(value)
        if fast is not None:
            dtype, data, shuffled = fast
            offset, nbytes = self.record.add(data)
            return {_TAG: "list", "d": dtype, "o": offset, "n": nbytes, "s": shuffled}
        # Exact types, not isinstance: bools, IntEnums and numpy scalars must not turn into
        # plain numbers.  list.count of one type beats set(map(type, ...)) by 2x here.
        kinds = list(map(type, value))
        kind = kinds[0]
        if kinds.count(kind) == len(kinds):
            if kind is int:
                # struct.pack(*list) converts 3x faster than array.array or np.array.
                try:
                    ints = np.frombuffer(struct.pack(f"<{len(value)}q", *value), np.int64)
                except struct.error:
                    return None  # beyond int64: JSON keeps any size exact
                narrow = _narrow_ints_dtype(ints)
                return {
                    _TAG: "list",
                    "d": narrow.name,
                    **self.record.add_shuffled(ints.astype(narrow, copy=False)),
                }
            if kind is float:
                floats = np.frombuffer(struct.pack(f"<{len(value)}d", *value), np.float64)
                # NOTE: out-of-range values and signalling NaNs warn on the cast (an error
                # under -W error); they just fail the bit-exact check below.
                with np.errstate(over="ignore", invalid="ignore"):
                    narrow = floats.astype(np.float32)
                # Bit-exact: nan payloads, -0.0 and inf survive only if every bit returns.
                if np.array_equal(narrow.astype(np.float64).view(np.int64), floats.view(np.int64)):
                    return {_TAG: "list", "d": "float32", **self.record.add_shuffled(narrow)}
                return {_TAG: "list", "d": "float64", **self.record.add_shuffled(floats)}
        return None

    def _tensor(self, value: torch.Tensor) -> Any:
        t, raw = _tensor_bytes(value)
        dtype = _TORCH_DTYPE_NAMES[t.dtype]
        if raw.nbytes > self.record.inline_limit:
            blob = encode_tensor_blob(t)
            if self.record.copy:
                blob.parts = [bytes(p) for p in blob.parts]
            self.record.tensor_blobs.setdefault(blob.digest, blob)
            return {
                _TAG: "ref",
                "h": blob.digest,
                "d": dtype,
                "sh": list(t.shape),
                "n": raw.nbytes,
            }
        offset, nbytes = self.record.add(bytes(raw) if raw.nbytes else b"")
        return {_TAG: "tensor", "d": dtype, "sh": list(t.shape), "o": offset, "n": nbytes}

    def _ndarray_tree(self, value: np.ndarray | np.generic) -> dict[str, Any]:
        # NOTE: not ascontiguousarray, which turns 0-d arrays and scalars into shape (1,);
        # tobytes() writes C order whatever the layout.
        arr = np.asarray(value)
        if arr.dtype.name not in _NUMPY_DTYPES or arr.dtype.byteorder == ">":
            raise UnencodableError(f"cannot store a numpy array of dtype {arr.dtype}")
        offset, nbytes = self.record.add(arr.tobytes())
        return {"sh": list(arr.shape), "o": offset, "n": nbytes}

    def _ndarray(self, value: np.ndarray) -> Any:
        return {_TAG: "ndarray", "d": value.dtype.name, **self._ndarray_tree(value)}


# marshal writes exact ints in int32 range as b"i" + 4 bytes and exact floats as b"g" + 8 bytes
# (little-endian); version 2 never writes back-references, so every item has a fixed size.
_MARSHAL_VERSION = 2
_MARSHAL_LIST_HEAD = 5  # b"[" + u32 count
_INT_CODES = b"i"
_FLOAT_CODES = b"g"


def _marshalled_numbers(value: list) -> tuple[str, bytes, bool] | None:
    """A list of exact ints (int32 range) or exact floats as a narrowed, shuffled array.

    Returns ``(dtype name, bytes, shuffled)`` laid out exactly as `_Record.add_shuffled` lays
    out the narrowed array, or None for any other list (the general path decides then).

    NOTE: marshal converts a list in one C loop and accepts only exact types (a bool, an
    IntEnum or a numpy scalar gives another type code or an error), which is the check the
    general path does with ``map(type, ...)``; measured on the 1024-sample rollout this halves
    the cost of turning token ids, masks and log-probs into arrays.
    """
    try:
        data = marshal.dumps(value, _MARSHAL_VERSION)
    except ValueError:  # an object marshal refuses (any non-builtin type), or a cycle
        return None
    n = len(value)
    head = _MARSHAL_LIST_HEAD
    # NOTE: bytes slicing, not numpy, for the type codes and the byte planes: a few C calls
    # per list instead of a dozen numpy calls, whose overhead dominated for a few thousand items.
    if len(data) == head + 5 * n:
        # Aligned by induction: item 0 starts right after the head, and an b"i" item is 5 bytes.
        if data[head::5] != _INT_CODES * n:
            return None
        narrow = _narrow_ints_dtype(np.ndarray((n,), "<i4", data, head + 1, (5,)))
        width = narrow.itemsize
        name = _NARROW_NAMES[narrow]  # dtype.name is computed in Python on every access
        # Little-endian two's complement: the low bytes of an int32 are the narrowed value;
        # byte plane j of the shuffled layout is byte j of every item.
        planes = [data[head + 1 + j :: 5] for j in range(width)]
        return name, b"".join(planes), width > 1
    if len(data) == head + 9 * n:
        if data[head::9] != _FLOAT_CODES * n:
            return None
        bits = np.ndarray((n,), "<i8", data, head + 1, (9,))
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = bits.view("<f8").astype(np.float32)
        # Bit-exact, as in `_Encoder._list`: nan payloads, -0.0 and inf must all come back.
        if (narrow.astype(np.float64).view(np.int64) == bits).all():
            packed, width, step, first = narrow.tobytes(), 4, 4, 0
        else:
            packed, width, step, first = data, 8, 9, head + 1
        planes = [packed[first + j :: step] for j in range(width)]
        return ("float32" if width == 4 else "float64"), b"".join(planes), True
    return None


_NARROW_NAMES = {dt: dt.name for dt, _, _ in _INT_NARROWING}


def _narrow_ints_dtype(ints: np.ndarray) -> np.dtype:
    if ints.size == 0:
        return np.dtype("int8")
    lo, hi = int(ints.min()), int(ints.max())
    for dt, dt_lo, dt_hi in _INT_NARROWING:
        if dt_lo <= lo and hi <= dt_hi:
            return dt
    return np.dtype("int64")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while bulk-building containers.

    NOTE: decoding a chunk creates thousands of lists and dicts, which triggers full
    collections that traverse every object of the (large) training process; measured on the
    1024-sample benchmark this was 25% of read time.  Nothing built here forms cycles.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_ZSTD_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    # ZstdCompressor objects are not thread-safe; one per thread lets saves run in parallel.
    comp = getattr(_ZSTD_LOCAL, "c", None)
    if comp is None:
        comp = _ZSTD_LOCAL.c = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_ZSTD_LOCAL, "d", None)
    if dec is None:
        dec = _ZSTD_LOCAL.d = zstandard.ZstdDecompressor()
    return dec


def _check_frame(body: memoryview, raw_len: int) -> None:
    """Refuse a zstd frame whose stated sizes (untrusted) are implausible or disagree."""
    if raw_len > body.nbytes * _MAX_RATIO + _RATIO_SLACK:
        raise IntegrityError("compressed data claims an implausible size")
    # NOTE: zstd trusts a frame's own content-size field over max_output_size, so a forged
    # field must be caught before decompressing, or it could demand any allocation.
    declared = zstandard.get_frame_parameters(body).content_size
    if declared not in (zstandard.CONTENTSIZE_UNKNOWN, raw_len):
        raise IntegrityError("compressed frame disagrees with its stated size")


def _inflate(body: memoryview, raw_len: int) -> bytes:
    """Decompress a zstd frame whose size the (untrusted) container states."""
    _check_frame(body, raw_len)
    out = _decompressor().decompress(body, max_output_size=max(raw_len, 1))
    if len(out) != raw_len:
        raise IntegrityError("data decompressed to the wrong length")
    return out


def _dumps(tree: Any) -> bytes:
    try:
        text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    except RecursionError as exc:
        raise UnencodableError("a sample is nested too deeply to be stored") from exc
    # surrogatepass: lone surrogates in model output are legal Python str and must round-trip.
    return text.encode("utf-8", "surrogatepass")


@dataclass
class EncodedSample:
    """One sample as a chunk record (uncompressed) and the tensor blobs it references."""

    record: bytes
    tensor_blobs: dict[str, TensorBlob]


def _key_text(key: Any) -> str:
    try:
        text = repr(key)
    except ValueError:  # an int of over 4,300 digits (alone or in a tuple) has no repr
        return f"<{type(key).__name__} too large to print>"
    return text if len(text) <= 80 else text[:79] + "…"


def _at(exc: UnencodableError, step: str) -> UnencodableError:
    """``exc`` with ``step`` (a field, a key, an index) prefixed to the path it names."""
    reason = exc.__dict__.setdefault("reason", str(exc))
    path = exc.__dict__["path"] = step + exc.__dict__.get("path", "")
    exc.args = (f"{path}: {reason}",)
    return exc


def encode_sample(
    sample: Any, *, inline_limit: int = DEFAULT_INLINE_LIMIT, copy: bool = False
) -> EncodedSample:
    """One sample as a record and its tensor blobs, ready for `RawChunk.add`.

    With ``copy``, no part of the result aliases the sample's memory (tensor blobs copy their
    bytes), so the caller may change the sample afterwards: what was encoded is what is stored.

    Raises:
        UnencodableError: a value cannot be stored losslessly and safely; the message names
            the field and the path to the value.
    """
    name, fields = sample_to_fields(sample)
    tensor_blobs: dict[str, TensorBlob] = {}
    record = _Record(inline_limit, tensor_blobs, copy=copy)
    encoder = _Encoder(record)
    # see _gc_paused; inline, as this runs for every sample
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        tree = {"c": name, "f": encoder._dict(fields, top=True)}
    except UnencodableError as exc:
        raise _at(exc, "sample field ") from None
    finally:
        if was_enabled:
            gc.enable()
    tree_bytes = _dumps(tree)
    head_len = _TREE_LEN.size + len(tree_bytes)
    pad = -head_len % _ALIGN
    data = b"".join([_TREE_LEN.pack(len(tree_bytes)), tree_bytes, b"\0" * pad, *record.arrays])
    return EncodedSample(data, tensor_blobs)


def _pack(raw: bytes) -> tuple[bytes, int, int]:
    packed = _compressor().compress(raw)
    if len(packed) < len(raw) and len(raw) <= len(packed) * _MAX_RATIO + _RATIO_SLACK:
        return packed, len(raw), _ZSTD
    return raw, len(raw), _RAW


def _pack_all(records: list[bytes]) -> list[tuple[Buffer, int, int]]:
    """`_pack` of every record, compressed in one call that releases the GIL once.

    NOTE: one zstd call per record meant one GIL hand-over per record on the packing thread
    (see `build_chunk`); the frames are the same bytes either way.
    """
    try:
        frames = _compressor().multi_compress_to_buffer(records) if records else []
    except (AttributeError, NotImplementedError, ValueError, TypeError, zstandard.ZstdError):
        return [_pack(raw) for raw in records]  # a backend without it: one call per record
    out: list[tuple[Buffer, int, int]] = []
    for raw, frame in zip(records, frames, strict=True):
        packed = memoryview(frame)
        if packed.nbytes < len(raw) and len(raw) <= packed.nbytes * _MAX_RATIO + _RATIO_SLACK:
            out.append((packed, len(raw), _ZSTD))
        else:
            out.append((raw, len(raw), _RAW))
    return out


@dataclass
class RawChunk:
    """A chunk's records, built but not yet compressed.

    Building needs the GIL; `pack` (zstd, join, hash) mostly does not, so a writer can pack
    and store chunk i on an I/O thread while it builds chunk i+1.
    """

    records: list[bytes]
    tensor_blobs: dict[str, TensorBlob]

    def add(self, encoded: EncodedSample) -> None:
        """Append one encoded sample (see `encode_sample`)."""
        self.records.append(encoded.record)
        for digest, blob in encoded.tensor_blobs.items():
            self.tensor_blobs.setdefault(digest, blob)

    def pack(self) -> EncodedChunk:
        """Compress the records and assemble the chunk blob."""
        records = _pack_all(self.records)
        offset = _HEAD.size + _INDEX.size * len(records)
        index = []
        for stored, raw_len, method in records:
            index.append(_INDEX.pack(offset, memoryview(stored).nbytes, raw_len, method))
            offset += memoryview(stored).nbytes
        data = b"".join(
            [_HEAD.pack(CHUNK_MAGIC, FORMAT_VERSION, 0, len(records)), *index]
            + [stored for stored, _, _ in records]
        )
        return EncodedChunk(data, digest_of(data), len(records), self.tensor_blobs)


# Seconds of encoding between two hand-overs of the GIL (see build_chunk).  Measured on the
# 1024-sample save: a hand-over per sample 0.35 s, every 0.5 ms or 2 ms 0.28 s.
_HAND_OVER_EVERY = 0.001


def build_chunk(samples: Sequence[Any], *, inline_limit: int = DEFAULT_INLINE_LIMIT) -> RawChunk:
    """Encode samples into uncompressed records (see `RawChunk`).

    Raises:
        UnencodableError: a sample holds a value that cannot be stored losslessly and safely.
    """
    if inline_limit < 0:
        raise ValueError("inline_limit must be >= 0")
    raw = RawChunk([], {})
    hand_over = GilHandOver()
    with _gc_paused():
        for sample in samples:
            raw.add(encode_sample(sample, inline_limit=inline_limit))
            hand_over()
    return raw


class GilHandOver:
    """Call between samples while encoding: lets go of the GIL about every millisecond.

    NOTE: a writer packs and stores earlier chunks on other threads whose every syscall and
    zstd call releases the GIL and then waits for it: behind a thread that never lets go, each
    wait lasts the 5 ms switch interval.  Measured: 16 blob writes took 0.74 s beside a busy
    encoder, 0.05 s with this yield.  Not after every sample: sleep(0) naps for the kernel's
    timer slack (~60 us), which added 80 ms to a 1024-sample save.
    """

    __slots__ = ("handed",)

    def __init__(self) -> None:
        self.handed = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self.handed > _HAND_OVER_EVERY:
            time.sleep(0)
            self.handed = time.perf_counter()


def encode_chunk(
    samples: Sequence[Any], *, inline_limit: int = DEFAULT_INLINE_LIMIT
) -> EncodedChunk:
    """Encode up to a chunk's worth of samples into one chunk blob.

    Raises:
        UnencodableError: a sample holds a value that cannot be stored losslessly and safely.
    """
    return build_chunk(samples, inline_limit=inline_limit).pack()


# --------------------------------------------------------------------------------------------
# Decoding


def _check_magic(magic: bytes, want: bytes, version: int, what: str) -> None:
    if magic != want:
        raise UnsupportedFormatError(f"{what} is not in archive_manager's format (bad magic)")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{what} has format version {version}; this library reads version "
            f"{FORMAT_VERSION} (upgrade archive_manager)"
        )


def _integrity(what: str, exc: BaseException) -> ArchiveError:
    if isinstance(exc, (IntegrityError, UnsupportedFormatError)):
        if type(exc) in (IntegrityError, UnsupportedFormatError) and not str(exc).startswith(what):
            # name the blob (and record) the error is about
            return type(exc)(f"{what}: {exc}")
        return exc
    return IntegrityError(f"{what} is malformed: {type(exc).__name__}: {exc}")


def _check_shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise IntegrityError(f"malformed tensor shape {shape!r:.80}")
    if len(shape) > _MAX_DIMS:
        raise IntegrityError("tensor has too many dimensions")
    return tuple(shape)


class _Decoder:
    """Rebuilds one sample's values from its tree and its record's array section."""

    def __init__(
        self,
        arrays: memoryview,
        loader: Callable[[str], torch.Tensor] | None,
        *,
        as_arrays: bool = False,
    ) -> None:
        self.arrays = arrays
        self.loader = loader
        self.as_arrays = as_arrays
        # NOTE: the encoder gives every array its own bytes, so the descriptors of a record
        # never reference more than its array section; hostile ones that alias the same bytes
        # many times would otherwise multiply the memory a small blob decodes to.
        self.budget = arrays.nbytes

    def _slice(self, node: dict) -> memoryview:
        offset, nbytes = node["o"], node["n"]
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise IntegrityError("malformed array descriptor")
        if offset + nbytes > self.arrays.nbytes:
            raise IntegrityError("array runs past the end of its record")
        self.budget -= nbytes
        if self.budget < 0:
            raise IntegrityError("array descriptors reference more bytes than the record holds")
        return self.arrays[offset : offset + nbytes]

    def fields(self, node: Any) -> Any:
        """The sample's fields; with ``as_arrays``, numeric list fields as numpy arrays."""
        if not self.as_arrays or type(node) is not dict:
            return self.decode(node)
        tag = node.get(_TAG)
        if tag is None:
            return {k: self._field(v) for k, v in node.items()}
        if tag == "map" and type(node.get("v")) is list:  # a dict sample with odd keys
            return {_hashable(self.decode(k)): self._field(v) for k, v in node["v"]}
        return self.decode(node)

    def _field(self, node: Any) -> Any:
        t = type(node)
        if t is dict and node.get(_TAG) == "list" and node.get("d") in _ARRAY_LIST_DTYPES:
            dtype = _NUMPY_DTYPES[node["d"]]
            arr = _unshuffle(self._slice(node), dtype, node["s"])
            # np.array(the saved list)'s dtype, and memory of its own (not a read-only view
            # that would keep the whole decompressed record alive).
            wide = np.int64 if dtype.kind in "iu" else np.float64
            return arr.astype(wide, copy=not arr.flags.writeable)
        value = self.decode(node)
        if type(value) is list and value:
            arr = _number_array(value)
            if arr is not None:
                return arr
        return value

    def decode(self, node: Any) -> Any:
        t = type(node)
        if t is list:
            return [self.decode(v) for v in node]
        if t is not dict:
            if node is None or t in (str, int, float, bool):
                return node
            raise IntegrityError(f"unexpected JSON value of type {t.__name__}")
        tag = node.get(_TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in node.items()}
        if tag == "list":
            dtype = _NUMPY_DTYPES[node["d"]]
            return _unshuffle(self._slice(node), dtype, node["s"]).tolist()
        if tag == "str":
            return bytes(self._slice(node)).decode("utf-8", "surrogatepass")
        if tag == "tuple":
            return tuple(self.decode(v) for v in node["v"])
        if tag == "map":
            return {_hashable(self.decode(k)): self.decode(v) for k, v in node["v"]}
        if tag == "tensor":
            return _tensor_from(
                self._slice(node), _TORCH_DTYPES[node["d"]], _check_shape(node["sh"]), exact=True
            )
        if tag == "ref":
            return TensorRef(
                check_digest(node["h"]),
                _TORCH_DTYPES[node["d"]],
                _check_shape(node["sh"]),
                int(node["n"]),
                self.loader,
            )
        if tag == "ndarray":
            return self._ndarray(node["d"], node).copy()
        if tag == "npscalar":
            return self._ndarray(node["d"], node["v"])[()]
        if tag == "int":
            if type(node["v"]) is not str:
                raise IntegrityError("malformed big int")
            return int(node["v"], 16)
        if tag == "nan":
            value = _NAN_BITS.unpack(bytes.fromhex(node["v"]))[0]
            if value == value:
                raise IntegrityError("malformed nan")
            return value
        raise UnsupportedFormatError(f"unknown value tag {tag!r:.40} (written by a newer library?)")

    def _ndarray(self, dtype_name: str, node: dict) -> np.ndarray:
        dtype = _NUMPY_DTYPES[dtype_name]
        shape = _check_shape(node["sh"])
        mv = self._slice(node)
        if math.prod(shape) * dtype.itemsize != mv.nbytes:
            raise IntegrityError("numpy array size does not match its stored bytes")
        return np.frombuffer(mv, dtype=dtype).reshape(shape)


# The stored dtypes of numeric lists whose values int64 or float64 hold exactly (the encoder
# writes no others; anything else is decoded as a list and judged by its values).
_ARRAY_LIST_DTYPES = frozenset(
    {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float32", "float64"}
)


def _number_array(values: list) -> np.ndarray | None:
    """``np.array(values)`` for a list of exact ints (within int64) or exact floats, else None."""
    kind = type(values[0])
    if kind not in (int, float) or countOf(map(type, values), kind) != len(values):
        return None
    try:
        return np.array(values, dtype=np.int64 if kind is int else np.float64)
    except OverflowError:
        return None


# NOTE: json's own decoder returns one shared object for every NaN it reads, and two distinct
# NaN keys ({nan_a: 1, nan_b: 2}, or tuple keys holding them) then collapse into one on load,
# since a dict finds a key by identity before equality.  float() makes a new object each time.
_TREE_DECODER = json.JSONDecoder(parse_constant=float)


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError as exc:
        raise IntegrityError("a mapping key decoded to an unhashable value") from exc
    return key


def _unshuffle(mv: memoryview, dtype: np.dtype, shuffled: bool) -> np.ndarray:
    itemsize = dtype.itemsize
    if mv.nbytes % itemsize:
        raise IntegrityError("array length is not a multiple of its item size")
    raw = np.frombuffer(mv, dtype=np.uint8)
    if shuffled and itemsize > 1:
        # NOTE: one strided store per byte plane; a transposed copy of the (itemsize, n)
        # planes took twice as long (9.3 against 5.0 us for 3,300 int32 token ids).
        planes = raw.reshape(itemsize, -1)
        out = np.empty((planes.shape[1], itemsize), np.uint8)
        for j in range(itemsize):
            out[:, j] = planes[j]
        raw = out.reshape(-1)
    return raw.view(dtype).reshape(-1)


class ChunkReader:
    """Random access to the samples of one chunk blob.

    Only the index is parsed up front; `sample` decompresses and decodes one record.
    """

    def __init__(
        self,
        data: Buffer,
        *,
        digest: str = "?",
        loader: Callable[[str], torch.Tensor] | None = None,
    ) -> None:
        self.digest = digest
        self.loader = loader
        self._mv = memoryview(data).cast("B")
        try:
            magic, version, _flags, count = _HEAD.unpack_from(self._mv, 0)
        except struct.error as exc:
            raise IntegrityError(f"chunk blob {digest} is truncated (no header)") from exc
        _check_magic(magic, CHUNK_MAGIC, version, f"chunk blob {digest}")
        if _HEAD.size + count * _INDEX.size > self._mv.nbytes:
            raise IntegrityError(f"chunk blob {digest} is truncated (index of {count} records)")
        self._count = count
        self._inflated: dict[int, memoryview] = {}

    def __len__(self) -> int:
        return self._count

    def inflate(self, offsets: Iterable[int]) -> None:
        """Decompress these records ahead of `sample`, which then only decodes them.

        One zstd call for all of them releases the GIL once, so a reader thread can inflate
        the next chunk while the caller decodes this one (one call per record made that
        thread wait for the GIL after every record).  A record that fails its checks here is
        left for `sample`, which raises its error with the record named.
        """
        todo: list[int] = []
        frames: list[memoryview] = []
        sizes: list[int] = []
        # NOTE: records are checked one by one against the ratio bound, but a forged index
        # can point many of them at one frame; the whole batch keeps the same bound as a
        # single record, and what is past it is left for `sample` to inflate one at a time.
        budget = self._mv.nbytes * _MAX_RATIO + _RATIO_SLACK
        for i in sorted(set(offsets)):
            if not 0 <= i < self._count or i in self._inflated:
                continue
            try:
                body, raw_len, method = self._body(i)
                if method == _ZSTD:
                    _check_frame(body, raw_len)
            except (ArchiveError, struct.error, zstandard.ZstdError, ValueError):
                continue
            if method == _ZSTD:
                budget -= raw_len
                if budget < 0:
                    break
                todo.append(i)
                frames.append(body)
                sizes.append(raw_len)
        if not todo:
            return
        try:
            out = _decompressor().multi_decompress_to_buffer(
                frames, decompressed_sizes=struct.pack(f"<{len(sizes)}Q", *sizes)
            )
        except (zstandard.ZstdError, ValueError, TypeError, MemoryError):
            return  # each `sample` inflates its own record and names the one that fails
        for i, raw_len, segment in zip(todo, sizes, out, strict=True):
            view = memoryview(segment)
            if view.nbytes == raw_len:
                self._inflated[i] = view

    def _body(self, i: int) -> tuple[memoryview, int, int]:
        offset, stored, raw_len, method = _INDEX.unpack_from(self._mv, _HEAD.size + i * _INDEX.size)
        if offset + stored > self._mv.nbytes or offset < _HEAD.size:
            raise IntegrityError("record runs past the end of the chunk")
        return self._mv[offset : offset + stored], raw_len, method

    def _record(self, i: int) -> memoryview:
        ahead = self._inflated.pop(i, None)
        if ahead is not None:
            return ahead
        body, raw_len, method = self._body(i)
        if method == _RAW:
            if raw_len != body.nbytes:
                raise IntegrityError("raw record length mismatch")
            return body
        if method != _ZSTD:
            raise UnsupportedFormatError(f"unknown record compression {method}")
        return memoryview(_inflate(body, raw_len))

    def sample(self, i: int, *, as_arrays: bool = False) -> Any:
        """Decode the sample at offset ``i`` of this chunk.

        With ``as_arrays``, every field that is a list of ints (within int64) or of floats
        comes back as ``np.array(that list)``: same values, int64 or float64, writable.
        """
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {self.digest} has {self._count} samples, not {i + 1}")
        what = f"chunk blob {self.digest}, record {i}"
        try:
            rec = self._record(i)
            (tree_len,) = _TREE_LEN.unpack_from(rec, 0)
            tree_end = _TREE_LEN.size + tree_len
            if tree_end > rec.nbytes:
                raise IntegrityError("tree runs past the end of its record")
            tree = _TREE_DECODER.decode(
                bytes(rec[_TREE_LEN.size : tree_end]).decode("utf-8", "surrogatepass")
            )
            arrays = rec[tree_end + (-tree_end % _ALIGN) :]
            if type(tree) is not dict or type(tree.get("f")) is not dict:
                raise IntegrityError("record tree is not a sample")
            name = tree.get("c")
            if name is not None and type(name) is not str:
                raise IntegrityError("record names a malformed sample class")
            with _gc_paused():
                fields = _Decoder(arrays, self.loader, as_arrays=as_arrays).fields(tree["f"])
                if type(fields) is not dict:
                    raise IntegrityError("record fields are not a mapping")
                return fields_to_sample(name, fields)
        except ArchiveError as exc:
            raise _integrity(what, exc) from exc
        except (
            struct.error,
            ValueError,
            KeyError,
            TypeError,
            IndexError,
            RecursionError,
            OverflowError,
            zstandard.ZstdError,
            RuntimeError,
            AttributeError,
            MemoryError,
        ) as exc:
            raise _integrity(what, exc) from exc

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._count):
            yield self.sample(i)


def decode_chunk(
    data: Buffer, *, digest: str = "?", loader: Callable[[str], torch.Tensor] | None = None
) -> list[Any]:
    """Every sample of a chunk blob, in order."""
    with _gc_paused():
        return list(ChunkReader(data, digest=digest, loader=loader))


# --------------------------------------------------------------------------------------------
# Manifests


_KINDS = {CHUNK_MAGIC: "chunk", TENSOR_MAGIC: "tensor", MANIFEST_MAGIC: "manifest"}
MAGIC_SIZE = len(CHUNK_MAGIC)


def blob_kind(head: bytes) -> str | None:
    """``"chunk"``, ``"tensor"`` or ``"manifest"`` from a blob's first `MAGIC_SIZE` bytes."""
    return _KINDS.get(bytes(head[:MAGIC_SIZE]))


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """An archive's manifest (plain JSON-able dict) as blob bytes: magic, version, zstd(JSON)."""
    body = json.dumps(manifest, separators=(",", ":"), allow_nan=True).encode()
    return _HEAD.pack(MANIFEST_MAGIC, FORMAT_VERSION, 0, len(body)) + _compressor().compress(body)


def decode_manifest(data: Buffer, digest: str = "?") -> dict[str, Any]:
    """The manifest dict stored in a manifest blob."""
    mv = memoryview(data).cast("B")
    what = f"manifest blob {digest}"
    try:
        magic, version, _flags, raw_len = _HEAD.unpack_from(mv, 0)
        _check_magic(magic, MANIFEST_MAGIC, version, what)
        manifest = json.loads(_inflate(mv[_HEAD.size :], raw_len))
        if type(manifest) is not dict:
            raise IntegrityError("manifest is not a mapping")
        return manifest
    except ArchiveError as exc:
        raise _integrity(what, exc) from exc
    except (struct.error, ValueError, RecursionError, zstandard.ZstdError, MemoryError) as exc:
        raise _integrity(what, exc) from exc
