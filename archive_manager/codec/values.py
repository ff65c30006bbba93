"""The value encoder and decoder: one sample <-> one chunk record.

A record is ``tree_len u32 | tree (JSON) | pad to 8 | arrays``.  The tree is the sample's
fields as tagged JSON (``{"$t": tag, ...}`` nodes for what JSON cannot hold as it is); the
bulky values (numeric lists, long strings, tensors, numpy arrays) are binary arrays after it,
referenced by offset and length.  Tensors and numeric numpy arrays above the inline limit
become tensor blobs (`tensors`); tensors are decoded as lazy `TensorRef` proxies
(`tensor_ref`), arrays read as they are decoded (``array_loader``).  What is refused and
why: docs/architecture/samples-and-values.md, "Samples and values".
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import gc
import json
import marshal
import math
import re
import struct
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from operator import countOf
from typing import TYPE_CHECKING, Any

import numpy as np

from .._util.constants import DEFAULT_INLINE_LIMIT
from .._util.digest import Buffer, check_digest
from .._util.lazy_torch import is_tensor, tensor_class
from ..errors import (
    IntegrityError,
    InvalidInputError,
    UnencodableError,
    UnsupportedFormatError,
)
from ..samples import (
    enum_to_record,
    fields_to_sample,
    record_to_enum,
    record_to_value,
    sample_to_record,
    value_to_record,
)
from ._accel import (
    native_arenas_ahead,
    native_dict_items,
    native_first_leaves,
    native_numbers,
    native_stored_list,
)
from .dtypes import numbers_as
from .tensor_ref import TensorRef
from .tensors import NUMPY_DTYPES as _NUMPY_DTYPES
from .tensors import (
    TensorBlob,
    _check_shape,
    _check_storable,
    _tensor_bytes,
    _tensor_from,
    encode_array_blob,
    encode_tensor_blob,
    torch_dtype_names,
    torch_dtypes,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "TEXT_FIELDS",
    "EncodedSample",
    "StoredNumbers",
    "TakenList",
    "decode_fields",
    "decode_record",
    "decode_sample",
    "encode_sample",
    "record_class_name",
]


_TREE_LEN = struct.Struct("<I")
# Short numeric lists cost more as arrays (descriptor, alignment) than as JSON.
_MIN_ARRAY_LEN = 8
_ALIGN = 8
# Long text (responses, prompts) goes to the array section as UTF-8: it skips JSON escaping
# on the way in and out.
_MIN_RAW_STR = 512
_TAG = "$t"
_STR_ONLY = {str}
#: The top-level fields a chunk of format version 2 stores in a record's text part, apart from
#: the rest, so that a search inflates only them (docs/architecture/chunk-format.md, "Chunk
#: format").
TEXT_FIELDS = ("prompt", "response")
# The rest part's node where a field moved to the text part was: keeps the fields' order.
_TEXT_NODE = {_TAG: "text"}
# JSON keeps neither a NaN's sign and payload nor (past sys.get_int_max_str_digits(), at least
# 640 digits) an int: those few scalars are tagged.
_NAN_BITS = struct.Struct("<d")
_CANONICAL_NAN = _NAN_BITS.pack(math.nan)
_BIG_INT = 10**600
_NEG_BIG_INT = -_BIG_INT
# NOTE: a sample is stored as a tree, so a sub-list, tuple or dict that it holds several times
# (a DAG, not a cycle) is written out once per path to it.  ``v = [v, v]`` repeated 40 times is
# 2**40 lists: past this many items written again for repeated containers, the save is refused
# (docs/architecture/samples-and-values.md, "Samples and values").
_MAX_REPEATED_ITEMS = 1 << 20
# NOTE: items are not the whole cost: a leaf held in many places (a string, an int, a
# float, a tensor, a numpy array, a dict key) is written again in each, views of one buffer
# (``a[:]``, ``t.view(-1)``, each a new object) write its bytes again, and the elements of a
# zero-stride view (``np.broadcast_to``, ``Tensor.expand``: a few bytes in memory, terabytes
# expanded) are written out one by one.  Every byte a record (and its tensor blobs) would
# hold beyond the memory the sample itself holds is bounded too
# (docs/architecture/samples-and-values.md, "Samples and values").
_MAX_EXTRA_BYTES = 1 << 28
# A leaf written in at most this many bytes is no bigger than the reference that holds it
# (None, bools, ints of up to 8 digits, strings of one character): not counted.
_SMALL_LEAF = 8
_SMALL_INT_LO, _SMALL_INT_HI = -(10**7), 10**8
# What a tensor or array node costs in the tree beyond its bytes (tag, dtype, offsets, alias),
# and per dimension of its shape; written again with every repeat.
_NODE_BYTES = 96
_DIM_BYTES = 21


# numpy's fixed-width text dtypes, by their dtype.str ("<U12", "|S5"): what np.array of strings
# gives (verl's reward-info columns).  Only these spellings are read back, so a stored dtype
# can never name an object, record or big-endian dtype.
_TEXT_DTYPE = re.compile(r"(<U|\|S)[0-9]{1,9}")


def _array_dtype_code(dtype: np.dtype) -> str | None:
    """How a node names an array's dtype: numeric by name, text by ``dtype.str``; None for a
    dtype the codec cannot hold as bytes."""
    if dtype.name in _NUMPY_DTYPES and dtype.byteorder != ">":
        return dtype.name
    if dtype.kind in "US" and _TEXT_DTYPE.fullmatch(dtype.str):
        return dtype.str
    return None


def _array_dtype(code: object) -> np.dtype:
    if type(code) is str:
        found = _NUMPY_DTYPES.get(code)
        if found is not None:
            return found
        if _TEXT_DTYPE.fullmatch(code):
            return np.dtype(code)
    raise IntegrityError(f"a stored numpy array has a malformed dtype {code!r:.40}")


_INT_NARROWING = [
    (np.dtype(n), int(np.iinfo(n).min), int(np.iinfo(n).max))
    for n in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64")
]


class TakenList:
    """A numeric list as a snapshot took it (`archive_manager.codec.snapshot`): the array the
    codec stores for it (``dtype``, ``data``, ``shuffled``: what `list_array` gives), and its
    length.  The encoder writes it as it writes the list; `describe_sample` reads its length
    as the list's."""

    # NOTE: no __init__ (one call fewer per list taken): ``length`` is set when it is made,
    # the rest once the snapshot converted the list (codec.snapshot.fill)
    __slots__ = ("data", "dtype", "length", "shuffled")
    data: Buffer
    dtype: str
    length: int
    shuffled: bool

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes


def list_array(value: list[Any]) -> tuple[str, Buffer, bool] | None:
    """A list of at least `_MIN_ARRAY_LEN` items as ``(dtype name, bytes, shuffled)``: the
    array a record stores for it, or None when it is no numeric list (the encoder writes its
    items then)."""
    # The C conversion (docs/architecture/samples-and-values.md, "Native list conversion")
    # writes what the Python paths below write; a list it does not take is theirs to decide.
    # NOTE: not `_marshalled_numbers` after it: the C conversion takes every list of exact
    # int32 ints or exact floats, all that marshal's can give, and marshal writes each item
    # of any other list whole (see `_marshalled_numbers`).
    fast = _native_numbers(value) if _native_numbers is not None else _marshalled_numbers(value)
    if fast is not None:
        return fast
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
            return (narrow.name, *_shuffled(ints.astype(narrow, copy=False)))
        if kind is float:
            floats = np.frombuffer(struct.pack(f"<{len(value)}d", *value), np.float64)
            # NOTE: out-of-range values and signalling NaNs warn on the cast (an error
            # under -W error); they just fail the bit-exact check below.
            with np.errstate(over="ignore", invalid="ignore"):
                singles = floats.astype(np.float32)
            # Bit-exact: nan payloads, -0.0 and inf survive only if every bit returns.
            if np.array_equal(singles.astype(np.float64).view(np.int64), floats.view(np.int64)):
                return ("float32", *_shuffled(singles))
            return ("float64", *_shuffled(floats))
    return None


def _shuffled(arr: np.ndarray) -> tuple[bytes, bool]:
    """A 1-d numeric array's bytes, in byte planes when wider than a byte (helps zstd)."""
    itemsize = arr.dtype.itemsize
    if itemsize > 1 and arr.size > 1:
        return arr.view(np.uint8).reshape(-1, itemsize).T.tobytes(), True
    return arr.tobytes(), False


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


class _Encoder:
    """Turns one sample's field values into a JSON tree plus binary arrays."""

    def __init__(
        self, record: _Record, ahead: Mapping[int, tuple[list[Any], TakenList]] | None = None
    ) -> None:
        self.record = record
        # numeric lists already converted (`codec.snapshot.lists_ahead`): id -> the list (held,
        # so its id names no other list while this runs) and its array
        self.ahead = ahead
        self.active: set[int] = set()
        # Containers met so far (all alive: the sample holds them while it is encoded) and the
        # items written again because a container was met again (see _MAX_REPEATED_ITEMS).
        self.seen: set[int] = set()
        self.repeated = 0
        # leaves written so far (see _MAX_EXTRA_BYTES): id -> the bytes writing one again
        # costs, or -1 until it is met a second time; and the bytes written again
        self.leaves: dict[int, int] = {}
        self.extra_bytes = 0
        # buffers (torch storages, numpy base buffers) tensors and arrays were written from:
        # key -> [bytes the buffer holds, bytes written from it]
        self.buffers: dict[Any, list[int]] = {}
        # memory tensors and arrays borrow from another object, by address space (see
        # `_numpy_buffer`): the address ranges it spans, the bytes written from them
        self.borrowed: dict[str, _AddressRanges] = {}
        # tensors and arrays by view (buffer, offset, shape, strides, dtype): the alias index
        # their nodes carry, and the object (kept alive: the key holds addresses); a view
        # above the inline limit also keeps its tensor-blob node, so it is hashed (and, for
        # the writer, copied) once
        self.views: dict[Any, tuple[int, Any, dict[str, Any] | None]] = {}

    def encode(self, value: Any) -> Any:
        t = type(value)
        if t is str:
            if len(value) >= _MIN_RAW_STR:
                data = self._long_text(value)
                offset, nbytes = self.record.add(data)
                return {_TAG: "str", "o": offset, "n": nbytes}
            if len(value) > 1:
                self._again(value)
            return value
        if value is None or t is bool:
            return value
        if t is int:
            if _SMALL_INT_LO < value < _SMALL_INT_HI:
                return value
            self._again(value)
            if _NEG_BIG_INT < value < _BIG_INT:
                return value
            return {_TAG: "int", "v": hex(value)}
        if t is float:
            self._again(value)
            if value != value and _NAN_BITS.pack(value) != _CANONICAL_NAN:
                return {_TAG: "nan", "v": _NAN_BITS.pack(value).hex()}
            return value
        if t is list:
            return self._list(value)
        if t is dict:
            return self._dict(value)
        if t is TakenList:
            return self._taken(value)
        if t is tuple:
            return {_TAG: "tuple", "v": self._items(value)}
        if is_tensor(value):
            if type(value) is not tensor_class():
                # NOTE: a subclass (torch.nn.Parameter, a user's) would load as a plain tensor
                # without what it adds (requires_grad, its methods): refused, not downgraded
                raise UnencodableError(
                    f"cannot store a {t.__module__}.{t.__qualname__} (a torch.Tensor "
                    "subclass): it would load as a plain torch.Tensor; store its data as one "
                    "(value.detach() for a Parameter, value.as_subclass(torch.Tensor) otherwise)"
                )
            return self._tensor(value)
        if isinstance(value, TensorRef):
            return self._tensor(value.materialize())
        if t is np.str_:
            # verl's reward-info arrays hand these out: loaded as numpy strings, exactly.
            return {_TAG: "npstr", "v": self.encode(str(value))}
        if t is np.bytes_:
            return {**self._bytes(bytes(value)), _TAG: "npbytes"}
        if isinstance(value, np.ndarray):
            if t is np.memmap:
                # A memory-mapped array (np.load(..., mmap_mode="r")) is an ndarray whose
                # bytes live in a file: that is where it is read from, not what it is.
                value = np.asarray(value)
            elif t is not np.ndarray:
                raise UnencodableError(
                    f"cannot store a {t.__module__}.{t.__qualname__} (a numpy.ndarray "
                    "subclass): it would load as a plain numpy.ndarray; store np.asarray(value) "
                    "(which drops what the subclass adds, e.g. a mask or matrix semantics)"
                )
            if value.dtype == object:
                return self._object_array(value)
            return self._ndarray(value)
        if (
            isinstance(value, np.generic)
            and t is value.dtype.type
            and value.dtype.name in _NUMPY_DTYPES
        ):
            self._again(value)
            return {_TAG: "npscalar", "d": value.dtype.name, "v": self._ndarray_tree(value)}
        if t is bytes or t is bytearray:
            return self._bytes(value)
        if t.__module__.startswith("PIL.") and _pil_image_class(value) is not None:
            return self._image(value)
        if isinstance(value, enum.Enum):
            name, raw = enum_to_record(value)
            return {_TAG: "enum", "c": name, "v": self.encode(raw)}
        if dataclasses.is_dataclass(t):
            return self._object(value)
        raise UnencodableError(
            f"cannot store a value of type {t.__module__}.{t.__qualname__}: samples may hold "
            "None, bool, int, float, str, bytes, lists/tuples/dicts of those, torch tensors, "
            "numpy arrays, and dataclasses and enums registered with "
            "archive_manager.register_sample_class()"
        )

    def _bytes(self, value: bytes | bytearray) -> dict[str, Any]:
        """Bytes in the array section; written again where the sample holds them again."""
        key = id(value)
        size = self.leaves.get(key)
        if size is not None and size >= 0:
            self._extra(size)
        self.leaves[key] = len(value)
        # a bytearray is copied: the caller may change it before the chunk is written
        data = value if type(value) is bytes else bytes(value)
        offset, nbytes = self.record.add(data)
        return {_TAG: "bytes" if type(value) is bytes else "bytearray", "o": offset, "n": nbytes}

    def _image(self, value: Any) -> dict[str, Any]:
        """A PIL image (slime's ``multimodal_inputs["images"]``): its mode, size, palette,
        info and pixel bytes, which rebuild an equal image without an image codec."""
        image: Any = value  # PIL is not a dependency: its types are not known here
        if not _exact_class(image, _pil_image_class(image)):
            raise UnencodableError(
                f"cannot store a {type(image).__module__}.{type(image).__qualname__} (a PIL "
                "image read from a file): it would load as a plain PIL.Image.Image; store "
                "image.copy() (or image.convert(mode)), which is one"
            )
        node = self._bytes(image.tobytes())
        node[_TAG] = "image"
        node["m"] = image.mode
        node["sz"] = list(image.size)
        palette = image.getpalette() if image.mode in ("P", "PA") else None
        if palette is not None:
            node["p"] = palette
        if image.info:
            node["i"] = self._dict(dict(image.info))
        return node

    def _object(self, value: Any) -> dict[str, Any]:
        """A registered dataclass inside a field: its registered name and its fields (the
        class rebuilds it on load, as a sample's own class does)."""
        name, fields = value_to_record(value)
        self._enter(value)
        try:
            return {_TAG: "obj", "c": name, "f": self._dict(fields)}
        finally:
            self.active.discard(id(value))

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

    def _again(self, value: Any) -> None:
        """Count a leaf (a str, int, float, numpy scalar) about to be written again.

        NOTE: one dict lookup per leaf; what writing it costs is measured once, on its
        second appearance.  The first is free: the sample holds it.
        """
        key = id(value)
        size = self.leaves.get(key)
        if size is None:
            self.leaves[key] = -1
            return
        if size < 0:
            size = self.leaves[key] = _leaf_bytes(value)
        if size > _SMALL_LEAF:
            self._extra(size)

    def _long_text(self, value: str) -> bytes:
        """A long string's UTF-8 bytes, counted against the bound when written again."""
        key = id(value)
        size = self.leaves.get(key)
        if size is not None and size >= 0:
            self._extra(size)  # before it is encoded again
        data = value.encode("utf-8", "surrogatepass")
        self.leaves[key] = len(data)
        return data

    def _from_buffer(self, buffer: Any, capacity: int, nbytes: int) -> None:
        """Count ``nbytes`` about to be written from a buffer holding ``capacity`` bytes:
        what all writes from one buffer add up to beyond its size is written again (a view
        held in many places, views of one buffer, a broadcast or overlapping view)."""
        state = self.buffers.get(buffer)
        if state is None:
            state = self.buffers[buffer] = [capacity, 0]
        elif capacity > state[0]:
            state[0] = capacity
        before = max(state[1] - state[0], 0)
        state[1] += nbytes
        after = max(state[1] - state[0], 0)
        if after > before:
            self._extra(after - before)

    def _from_memory(
        self, memory: tuple[str, int, int], nbytes: int, footprint: list[tuple[int, int]] | None
    ) -> None:
        """Count ``nbytes`` about to be written from borrowed memory ``(address space,
        start, end)`` by a view whose elements lie in ``footprint``: what all such writes add
        up to beyond the addresses their elements cover is written again, whichever object
        lent each view its memory.

        NOTE: the view's elements, not the range its lender claims: an
        ``__array_interface__`` or DLPack exporter can claim any strides, and a 2-element
        view leaping from one buffer to another terabytes away spanned (and so vouched for)
        the whole gap, after which any number of views were written free (tests/codec/test_expansion_bound.py).
        A view with too many scattered rows to list (None) vouches for nothing: its bytes
        count as written again, which errs towards refusing.
        """
        space, start, end = memory
        ranges = self.borrowed.get(space)
        if ranges is None:
            ranges = self.borrowed[space] = _AddressRanges()
        for lo, hi in footprint or ():
            ranges.add(max(lo, start), min(hi, end), 0)
        beyond = ranges.add(0, 0, nbytes)
        if beyond:
            self._extra(beyond)

    def _extra(self, nbytes: int) -> None:
        """Count bytes a record would hold beyond the sample's own memory; refuse past the
        bound, before they are written."""
        self.extra_bytes += nbytes
        if self.extra_bytes > _MAX_EXTRA_BYTES:
            raise UnencodableError(
                "storing the sample would write more than "
                f"{_MAX_EXTRA_BYTES:,} bytes beyond the memory it holds (a value held in many "
                "places is written once per place, and a broadcast or expanded view's "
                "elements one by one); store the base and broadcast it after loading"
            )

    def _items(self, values: list[Any] | tuple[Any, ...]) -> list[Any]:
        self._enter(values)
        index = -1
        try:
            # Plain leaves met for the first time (docs/architecture/samples-and-values.md, "Native
            # list conversion"): encode() returns them as they are; the C side marks them in
            # `leaves` as _again() would, and leaves any other list to the loop below.
            if _native_first_leaves is not None and _native_first_leaves(values, self.leaves):
                return list(values)
            # NOTE: the index is counted, not searched for by identity afterwards: an object
            # held many times can fail at a later place only (the repeat bounds).
            return [self.encode(v) for v in values if (index := index + 1) >= 0]
        except UnencodableError as exc:
            raise error_at(exc, f"[{index}]") from None
        finally:
            self.active.discard(id(values))

    def _dict(self, value: dict[Any, Any], *, top: bool = False) -> Any:
        self._enter(value)
        key: Any = None
        try:
            if _native_dict_items is not None:
                # The C loop (docs/architecture/samples-and-values.md, "Native list conversion")
                # does what the one below does for a dict of str keys, calling back for what is not
                # a first-met plain leaf; None: a map, for the Python path.
                where: list[Any] = [None]
                try:
                    out = _native_dict_items(
                        value, self.leaves, self.encode, None if top else self._again, where
                    )
                except (UnencodableError, RecursionError):
                    key = where[0]
                    raise
                if out is not None:
                    return out
            # NOTE: ``key :=`` keeps the key being encoded for the error message below
            if _TAG not in value and all(type(k) is str for k in value):
                if not top:
                    # its str keys are written as they are, never through `encode`
                    for key in value:
                        if len(key) > 1:
                            self._again(key)
                    key = None
                out = {(key := k): self.encode(v) for k, v in value.items()}
                # NOTE: keys checked before the loop can change under it (another thread, a
                # tensor ref's loader swapping one key for another keeps the size, which the
                # iterator does not notice when the removed key was still ahead): an int key
                # would be written as a string, "$t" as a tag that makes the record
                # unreadable.  Refused as the C loop (`dict_items`) refuses it (tests/codec/test_codec_fast.py).
                if _TAG in out or not set(map(type, out)) <= _STR_ONLY:
                    raise RuntimeError("dictionary keys changed during iteration")
                return out
            return {
                _TAG: "map",
                "v": [[self._key(key := k), self.encode(v)] for k, v in value.items()],
            }
        except UnencodableError as exc:
            raise error_at(exc, key_text(key) if top else f"[{key_text(key)}]") from None
        except RecursionError:
            if not top:
                raise
            # converted here, at the top, where the stack has room again
            deep = UnencodableError("the value is nested too deeply to be stored")
            raise error_at(deep, key_text(key)) from None
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
        if isinstance(key, TensorRef) or is_tensor(key):
            # NOTE: a tensor hashes by identity, so a loaded copy would never equal the key
            # it replaces (and a lazy ref above the inline limit is not hashable at all).
            raise UnencodableError("a tensor cannot be stored as a mapping key")
        return self.encode(key)

    def _list(self, value: list[Any]) -> Any:
        if len(value) >= _MIN_ARRAY_LEN:
            got = self.ahead.get(id(value)) if self.ahead else None
            node: dict[str, Any] | None
            # NOTE: a list whose length changed since it was converted (another thread ran
            # meanwhile: a save hands the GIL over) is read again, so that its record agrees
            # with the description, which reads its length when the sample is described.
            if got is not None and got[0] is value and got[1].length == len(value):
                node = self._array_node(got[1].dtype, got[1].data, got[1].shuffled)
            else:
                node = self._array(value)
            if node is not None:
                return self._met(value, node)
        return self._items(value)

    def _array(self, value: list[Any]) -> dict[str, Any] | None:
        """A numeric list as one binary array, or None when it is not one."""
        got = list_array(value)
        return None if got is None else self._array_node(*got)

    def _taken(self, value: TakenList) -> dict[str, Any]:
        """A numeric list a snapshot took (`TakenList`): its array, as `_list` writes it."""
        return self._met(value, self._array_node(value.dtype, value.data, value.shuffled))

    def _array_node(self, dtype: str, data: Buffer, shuffled: bool) -> dict[str, Any]:
        """A numeric list's array added to the record, and the node naming it."""
        offset, nbytes = self.record.add(data)
        return {_TAG: "list", "d": dtype, "o": offset, "n": nbytes, "s": shuffled}

    def _met(self, value: list[Any] | TakenList, node: dict[str, Any]) -> dict[str, Any]:
        """``node``, the array of ``value``; a list met again counts as a container written
        again, and its array's bytes as bytes written again."""
        key = id(value)
        if key in self.seen:
            self._count(value, key)
            self._extra(node["n"])
        else:
            self.seen.add(key)
        return node

    def _tensor(self, value: torch.Tensor) -> Any:
        _check_storable(value)
        storage = value.untyped_storage()
        # NOTE: storages of no bytes may all sit at address 0: never one buffer
        address = storage.data_ptr() if storage.nbytes() else ("empty", id(value))
        buffer = ("torch", value.device, address)
        view = (
            buffer,
            value.storage_offset(),
            tuple(value.shape),
            value.stride(),
            value.dtype,
            value.is_conj(),
            value.is_neg(),
        )
        known = self.views.get(view)
        if known is not None and known[2] is not None:
            # the same tensor-blob view again: its node, not its bytes (stored once)
            self._extra(_NODE_BYTES + _DIM_BYTES * value.dim())
            return dict(known[2])
        nbytes = value.numel() * value.element_size()
        if known is not None:
            self._extra(_NODE_BYTES + _DIM_BYTES * value.dim())
        # before .contiguous() expands a broadcast view or copies the bytes
        memory = _borrowed_storage(storage, value.device)
        if memory is None:
            self._from_buffer(buffer, storage.nbytes(), nbytes)
        else:
            footprint = _footprint(
                value.data_ptr(),
                value.shape,
                [step * value.element_size() for step in value.stride()],
                value.element_size(),
            )
            self._from_memory(memory, nbytes, footprint)
        alias = self._alias(view, value) if known is None else known[0]
        t, raw = _tensor_bytes(value)
        dtype = torch_dtype_names()[t.dtype]
        if raw.nbytes > self.record.inline_limit:
            node = self._blob_node("ref", encode_tensor_blob(t), dtype, alias)
            self.views[view] = (alias, value, node)
            return dict(node)
        offset, nbytes = self.record.add(bytes(raw) if raw.nbytes else b"")
        return {
            _TAG: "tensor",
            "d": dtype,
            "sh": list(t.shape),
            "o": offset,
            "n": nbytes,
            "a": alias,
        }

    def _alias(self, view: Any, value: Any) -> int:
        """The alias index of a new view (see `_Decoder`: nodes with one index load as one
        object); the value is kept with it, as the key holds its addresses."""
        alias = len(self.views)
        self.views[view] = (alias, value, None)
        return alias

    def _object_array(self, value: np.ndarray) -> dict[str, Any]:
        """A numpy array of dtype object (verl's ``non_tensor_batch`` columns: ids, prompts as
        chat messages, reward-model dicts): its shape and each item, any storable value, in C
        order.  It loads as an object array of the same shape holding equal items."""
        items = [self.encode(item) for item in value.ravel(order="C")]
        return {_TAG: "ndobj", "sh": list(value.shape), "v": items}

    def _ndarray_tree(self, value: np.ndarray | np.generic) -> dict[str, Any]:
        # NOTE: not ascontiguousarray, which turns 0-d arrays and scalars into shape (1,);
        # tobytes() writes C order whatever the layout.
        arr = np.asarray(value)
        if _array_dtype_code(arr.dtype) is None:
            raise UnencodableError(
                f"cannot store a numpy array of dtype {arr.dtype} (numeric, bool, fixed-width "
                "text and object arrays are stored)"
            )
        offset, nbytes = self.record.add(arr.tobytes())
        return {"sh": list(arr.shape), "o": offset, "n": nbytes}

    def _ndarray(self, value: np.ndarray) -> Any:
        buffer, capacity, memory = _numpy_buffer(value)
        view = (
            buffer,
            value.__array_interface__["data"][0],
            value.shape,
            value.strides,
            value.dtype.str,
        )
        known = self.views.get(view)
        if known is not None and known[2] is not None:
            # the same blob-stored view again: its node, not its bytes (stored once)
            self._extra(_NODE_BYTES + _DIM_BYTES * value.ndim)
            return dict(known[2])
        if known is not None:
            self._extra(_NODE_BYTES + _DIM_BYTES * value.ndim)
        # before tobytes() expands a broadcast view
        if memory is None:
            self._from_buffer(buffer, capacity, value.nbytes)
        else:
            footprint = _footprint(
                value.__array_interface__["data"][0], value.shape, value.strides, value.itemsize
            )
            self._from_memory(memory, value.nbytes, footprint)
        alias = self._alias(view, value) if known is None else known[0]
        code = _array_dtype_code(value.dtype)
        if value.nbytes > self.record.inline_limit and code in _NUMPY_DTYPES:
            # NOTE: as a tensor above the limit, its own blob, mapped in place on load
            # rather than inflated out of the chunk (docs/architecture/samples-and-values.md,
            # "Arrays as blobs")
            node = self._blob_node("ndref", encode_array_blob(value), code, alias)
            self.views[view] = (alias, value, node)
            return dict(node)
        return {_TAG: "ndarray", "d": code, **self._ndarray_tree(value), "a": alias}

    def _blob_node(self, tag: str, blob: TensorBlob, dtype: str, alias: int) -> dict[str, Any]:
        """The node of a tensor (``ref``) or array (``ndref``) stored as ``blob``, which the
        record's blobs now hold (copied with ``copy``)."""
        if self.record.copy:
            blob.parts = [bytes(p) for p in blob.parts]
        self.record.tensor_blobs.setdefault(blob.digest, blob)
        return {
            _TAG: tag,
            "h": blob.digest,
            "d": dtype,
            "sh": list(blob.shape),
            "n": blob.nbytes,
            "a": alias,
        }


def _pil_image_class(value: Any) -> type | None:
    """PIL's image class when PIL is loaded and ``value`` is one of its images, else None.
    PIL is never imported to answer: a value cannot be an image unless it was."""
    module = sys.modules.get("PIL.Image")
    image = getattr(module, "Image", None) if module is not None else None
    return image if isinstance(image, type) and isinstance(value, image) else None


def _exact_class(value: object, cls: type | None) -> bool:
    return cls is not None and type(value) is cls


def _decode_image(node: dict[str, Any], data: memoryview, decode: Callable[[Any], Any]) -> Any:
    try:
        from PIL import Image  # a fixed library, never a name the payload gives
    except ImportError:
        raise UnsupportedFormatError(
            "the sample holds a PIL image: install Pillow to load it"
        ) from None
    size = node["sz"]
    if type(node["m"]) is not str or type(size) is not list or len(size) != 2:
        raise IntegrityError("a stored image is malformed")
    try:
        image = Image.frombytes(node["m"], (int(size[0]), int(size[1])), bytes(data))
        if "p" in node:
            image.putpalette(node["p"])
    except (ValueError, TypeError) as exc:
        raise IntegrityError(f"a stored image is malformed: {exc}") from None
    if "i" in node:
        info = decode(node["i"])
        if type(info) is not dict:
            raise IntegrityError("a stored image's info is malformed")
        image.info.update(info)
    return image


def _leaf_bytes(value: Any) -> int:
    """The bytes the tree takes to write ``value`` (a str, int, float or numpy scalar)."""
    t = type(value)
    if t is int:
        if _NEG_BIG_INT < value < _BIG_INT:
            return len(str(value))
        return len(hex(value)) + 16  # {"$t":"int","v":"..."}
    if t is str:
        return len(_dumps(value))
    if t is float:
        return 40 if value != value else len(repr(value))  # a tagged NaN at most
    size: int = _NODE_BYTES + value.nbytes  # a numpy scalar: its node and bytes
    return size


def _numpy_buffer(arr: np.ndarray) -> tuple[Any, int, tuple[str, int, int] | None]:
    """The buffer an array's bytes are in, as a key, the bytes it holds, and, when the memory
    is borrowed from an object other than its owner, its address range (see `_AddressRanges`).

    NOTE: numpy points every view's ``base`` at the array that owns the memory (or at the
    object it wraps: bytes, a torch tensor, ``as_strided``'s DummyArray holding the array).
    """
    root: Any = arr
    while True:
        base = root.base
        # A memoryview (np.frombuffer(memoryview(b)), np.asarray(memoryview(a)), ctypes) is a
        # new object per view over the same memory: the buffer is what it exports.
        while isinstance(base, memoryview) and base.obj is not None:
            base = base.obj
        if isinstance(base, np.ndarray):
            root = base
        elif type(base).__name__ == "DummyArray" and isinstance(
            getattr(base, "base", None), np.ndarray
        ):
            root = base.base
        else:
            break
    base = root.base
    while isinstance(base, memoryview) and base.obj is not None:
        base = base.obj
    if base is None:
        return ("numpy", id(root)), root.nbytes, None
    if is_tensor(base):
        storage = base.untyped_storage()
        return (
            ("torch", base.device, storage.data_ptr()),
            storage.nbytes(),
            _borrowed_storage(storage, base.device),
        )
    # NOTE: any other base lends memory it may not own, and a new one can be made per view
    # over the same addresses (an ``__array_interface__`` or DLPack exporter, a ctypes array
    # from_address): the memory is known by its address range, never by the object.
    try:
        # the buffer the array was made from (so it spans the array): all of it is held
        whole = np.frombuffer(base, np.uint8)
    except (TypeError, ValueError, BufferError):
        start, end = _span(root)
    else:
        start = whole.__array_interface__["data"][0]
        end = start + whole.nbytes
    return ("buffer", id(base)), end - start, ("cpu", start, end)


def _borrowed_storage(storage: Any, device: Any) -> tuple[str, int, int] | None:
    """A torch storage's address range when it borrows its memory, else None.

    NOTE: torch resizes only storages whose memory its allocator owns; ``torch.from_numpy``,
    ``torch.frombuffer`` and DLPack make a new storage per call over memory another object
    holds, so ``from_numpy(a[i:])`` windows are distinct storages over one buffer.
    """
    nbytes = storage.nbytes()
    if not nbytes or storage.resizable():
        return None
    address = storage.data_ptr()
    return (str(device), address, address + nbytes)


def _span(arr: np.ndarray) -> tuple[int, int]:
    """The addresses ``[start, end)`` an array's elements lie within."""
    start = end = arr.__array_interface__["data"][0]
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        return start, start + arr.nbytes
    if arr.size:
        for n, stride in zip(arr.shape, arr.strides, strict=True):
            if stride < 0:
                start += (n - 1) * stride
            else:
                end += (n - 1) * stride
        end += arr.itemsize
    return start, end


#: Most rows (runs of contiguous bytes) of one borrowed view listed one by one.
_MAX_ROWS = 1 << 16


def _footprint(
    address: int, shape: Any, strides: Any, itemsize: int
) -> list[tuple[int, int]] | None:
    """The address ranges ``[lo, hi)`` a view's elements cover: its contiguous runs of bytes
    (rows), merged; None past `_MAX_ROWS` scattered rows."""
    dims = []
    for n, step in zip(shape, strides, strict=True):
        if n == 0:
            return []
        if n > 1:
            if step < 0:  # walked backwards: the same addresses from the lowest one
                address += (n - 1) * step
                step = -step
            dims.append((step, n))
    dims.sort()
    block = itemsize
    outer: list[tuple[int, int]] = []
    for step, n in dims:
        if step == 0:
            continue  # a broadcast dimension: the same bytes again
        if not outer and step <= block:
            block += (n - 1) * step  # contiguous (or overlapping) with what is inside it
        else:
            outer.append((step, n))
    rows = 1
    for _, n in outer:
        rows *= n
        if rows > _MAX_ROWS:
            return None
    starts = [address]
    for step, n in outer:
        starts = [s + k * step for s in starts for k in range(n)]
    starts.sort()
    merged: list[tuple[int, int]] = []
    for lo in starts:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], lo + block))
        else:
            merged.append((lo, lo + block))
    return merged


class _AddressRanges:
    """The memory tensors and arrays of one sample borrow, in one address space: the
    disjoint address ranges their views span, and the bytes written from them.

    What is written beyond the addresses spanned is written again, however many objects lent
    the views (docs/architecture/samples-and-values.md, "Samples and values").  The ranges stay
    valid while the sample is encoded: the encoder keeps every tensor and array it wrote alive.
    """

    __slots__ = ("charged", "ends", "held", "starts", "written")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.held = 0
        self.written = 0
        self.charged = 0

    def add(self, start: int, end: int, nbytes: int) -> int:
        """Record ``nbytes`` written from ``[start, end)``; the bytes newly written beyond
        the ranges held (counted once: a range spanned later takes back nothing)."""
        if end > start:
            # the ranges that overlap or touch [start, end) are merged with it
            i = bisect_left(self.ends, start)
            j = bisect_right(self.starts, end)
            if i < j:
                self.held -= sum(self.ends[i:j]) - sum(self.starts[i:j])
                start, end = min(start, self.starts[i]), max(end, self.ends[j - 1])
            self.starts[i:j] = [start]
            self.ends[i:j] = [end]
            self.held += end - start
        self.written += nbytes
        beyond = self.written - self.held - self.charged
        if beyond <= 0:
            return 0
        self.charged += beyond
        return beyond


# None when the extension is not built (or ARCHIVE_MANAGER_NO_NATIVE is set); tests set it to
# None to run the Python paths.
_native_numbers = native_numbers
_native_first_leaves = native_first_leaves
_native_dict_items = native_dict_items
_native_stored_list = native_stored_list

# marshal writes exact ints in int32 range as b"i" + 4 bytes and exact floats as b"g" + 8 bytes
# (little-endian); version 2 never writes back-references, so every item has a fixed size.
_MARSHAL_VERSION = 2
_MARSHAL_LIST_HEAD = 5  # b"[" + u32 count
_INT_CODES = b"i"
_NUMBER_TYPES = frozenset((int, float))
_FLOAT_CODES = b"g"


def _marshalled_numbers(value: list[Any]) -> tuple[str, bytes, bool] | None:
    """A list of exact ints (int32 range) or exact floats as a narrowed, shuffled array.

    Returns ``(dtype name, bytes, shuffled)`` laid out exactly as `_shuffled` lays
    out the narrowed array, or None for any other list (the general path decides then).

    NOTE: marshal converts a list in one C loop and accepts only exact types (a bool, an
    IntEnum or a numpy scalar gives another type code or an error), which is the check the
    general path does with ``map(type, ...)``; measured on the 1024-sample rollout this halves
    the cost of turning token ids, masks and log-probs into arrays.

    NOTE: only a list of ints and floats is handed to marshal, which writes an object of the
    buffer protocol (a numpy array, bytes) whole each time it is met, before any bound of
    the encoder is checked: a list holding one 2 MiB array 2,000 times was 4 GB in memory
    before it was refused or stored as 2,000 references to one blob
    (tests/codec/test_expansion_bound.py).
    """
    if not set(map(type, value)) <= _NUMBER_TYPES:
        return None
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
            singles = bits.view("<f8").astype(np.float32)
        # Bit-exact, as in `_Encoder._list`: nan payloads, -0.0 and inf must all come back.
        if (singles.astype(np.float64).view(np.int64) == bits).all():
            packed, width, step, first = singles.tobytes(), 4, 4, 0
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
def gc_paused(*, promote: bool = False) -> Iterator[None]:
    """Pause the cyclic GC while bulk-building containers.

    NOTE: decoding a chunk creates thousands of lists and dicts, which triggers full
    collections that traverse every object of the (large) training process; measured on the
    1024-sample benchmark this was 25% of read time.  Nothing built here forms cycles.

    With ``promote`` (a load, whose objects the caller keeps), the containers made meanwhile
    join the oldest generation when the GC resumes instead of the youngest (`_promote_young`),
    and pymalloc's arenas are made ready on a thread of their own meanwhile (the C
    extension's ``arenas_ahead``: docs/architecture/reading.md, "Arenas made ahead").
    """
    was_enabled = gc.isenabled()
    gc.disable()
    ahead = native_arenas_ahead if promote else None
    try:
        if ahead is not None:
            ahead(True)
        yield
    finally:
        if ahead is not None:
            ahead(False)
        if was_enabled:
            if promote:
                _promote_young()
            gc.enable()


def _promote_young() -> None:
    """Move every object of the young generations to the oldest one, without a collection.

    NOTE: a load's lists of numbers are young when the GC resumes, so the next young
    collection (right away: the allocation count ran on while paused) traversed every item
    of every list, 0.1-0.2 s on the 1024-sample benchmark, and the next one again, to find
    nothing to free: nothing a load builds forms cycles.  gc.freeze() then gc.unfreeze()
    moves the young generations to the oldest in O(1) (CPython splices its lists); the
    objects are looked at by the next full collection, as they would be once promoted.  The
    caller's own young objects move too: a cycle of theirs is freed by the next full
    collection rather than a young one, which this runs instead of promoting once enough
    was promoted (below).  Skipped when the process froze objects itself (gc.freeze()
    before a fork): unfreeze would thaw them.
    """
    global _promoted, _full_collections, _promote_budget
    if gc.get_freeze_count() != 0:
        return
    # NOTE: gc.freeze() zeroes every generation's count, the count of young collections that
    # starts an older one included: a process loading (or saving in the background) more
    # often than CPython's 100 young collections before a full one never ran another, and
    # the garbage cycles promoted here piled up for good (a loop making 2,000 small cycles
    # a step grew by 0.67 MiB a step).  So a full collection runs in place of the promotion
    # once the young objects promoted since the last one (whoever ran it) pass a quarter of
    # those that survived it, CPython's own rule for starting one, and at least
    # `_PROMOTE_FLOOR`: what the process's heap amortizes, as CPython's cadence would.
    full = gc.get_stats()[2]["collections"]
    if full != _full_collections:
        _full_collections, _promoted = full, 0
    _promoted += gc.get_count()[0]
    if _promoted > _promote_budget:
        gc.collect()
        _promote_budget = max(_PROMOTE_FLOOR, len(gc.get_objects()) // 4)
        _full_collections, _promoted = gc.get_stats()[2]["collections"], 0
        return
    gc.freeze()
    gc.unfreeze()


# `_promote_young`'s account: the young objects it promoted since the last full collection,
# that collection's number, and how many may be promoted before the next (a quarter of the
# objects the last full collection it ran left, at least the floor: CPython's 100 young
# collections of 700 objects each before its first full one).
_PROMOTE_FLOOR = 70_000
_promoted = 0
_full_collections = -1
_promote_budget = _PROMOTE_FLOOR


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(tree, ensure_ascii=False, separators=(",", ":"), allow_nan=True)``, with
    the C encoder made once.

    NOTE: `json.dumps` with options builds a `json.JSONEncoder` and its C encoder at every
    call: half the cost of a record's small tree (2 calls a sample, 10-15 ms of a
    1024-sample save on the caller's thread).  The C encoder with the options `dumps` gives
    it writes the same text; without it (a Python built without ``_json``), `dumps` itself.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is not None:

        def encode(tree: Any) -> str:
            return "".join(encoder(tree, 0))

        probe = {"a": [1, 2.5, float("nan"), None, True, "\u00e9\ud800"], "b": {"c": -0.0}}
        # NOTE: c_make_encoder is private: a Python whose signature differs (its make or its
        # call raising) falls back as one whose text differs, instead of failing the import
        # of the package (tests/codec/test_codec_fast.py).
        with contextlib.suppress(TypeError, ValueError):
            encoder = make(
                None, None, json.encoder.encode_basestring, None, ":", ",", False, False, True
            )
            if encode(probe) == json.dumps(
                probe, ensure_ascii=False, separators=(",", ":"), allow_nan=True
            ):
                return encode
    return functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


_encode_json = _json_encoder()


def _dumps(tree: Any) -> bytes:
    try:
        text = _encode_json(tree)
    except RecursionError as exc:
        raise UnencodableError("a sample is nested too deeply to be stored") from exc
    # surrogatepass: lone surrogates in model output are legal Python str and must round-trip.
    return text.encode("utf-8", "surrogatepass")


@dataclass
class EncodedSample:
    """One sample as a chunk record (uncompressed) and the tensor blobs it references.

    ``text`` is the record's text part (its `TEXT_FIELDS`, laid out as a record of their own)
    and ``record`` the rest, whose tree marks where they were; ``text`` is empty when the
    sample has none of them (or a field name that is not a string), and ``record`` is then the
    whole sample, as in a chunk of format version 1.  ``kept``: the values stored for the
    top-level fields `encode_sample` was asked to keep (those the sample has), as a load
    decodes them (a `Sample`'s status as its value): what the writer compares the catalog's
    description with.
    """

    record: bytes
    tensor_blobs: dict[str, TensorBlob]
    text: bytes = b""
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)


def key_text(key: Any) -> str:
    try:
        text = repr(key)
    except ValueError:  # an int of over 4,300 digits (alone or in a tuple) has no repr
        return f"<{type(key).__name__} too large to print>"
    return text if len(text) <= 80 else text[:79] + "…"


def error_at(exc: UnencodableError, step: str) -> UnencodableError:
    """``exc`` with ``step`` (a field, a key, an index) prefixed to the path it names."""
    reason = exc.__dict__.setdefault("reason", str(exc))
    path = exc.__dict__["path"] = step + exc.__dict__.get("path", "")
    exc.args = (f"{path}: {reason}",)
    return exc


def encode_sample(
    sample: Any,
    *,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    copy: bool = False,
    texts: Collection[str] = TEXT_FIELDS,
    keep: Collection[str] = (),
    ahead: Mapping[int, tuple[list[Any], TakenList]] | None = None,
) -> EncodedSample:
    """One sample as a record and its tensor blobs, ready for `RawChunk.add`.

    The top-level fields named in ``texts`` go to the record's text part (empty ``texts``:
    a whole record, as chunk format version 1 stores it).  The stored values of the fields
    named in ``keep`` are handed back as ``kept`` (references, not copies).  ``ahead`` holds
    numeric lists of the sample already converted to their arrays (`snapshot.lists_ahead`):
    the same bytes, written without reading the list again.

    With ``copy``, no part of the result aliases the sample's memory (tensor blobs copy their
    bytes), so the caller may change the sample afterwards: what was encoded is what is stored.

    Raises:
        UnencodableError: a value cannot be stored losslessly and safely; the message names
            the field and the path to the value.
    """
    name, fields, converted = sample_to_record(sample)
    tensor_blobs: dict[str, TensorBlob] = {}
    record = _Record(inline_limit, tensor_blobs, copy=copy)
    encoder = _Encoder(record, ahead)
    moved = [k for k in texts if k in fields]
    if moved and (_TAG in fields or set(map(type, fields)) != _STR_ONLY):
        moved = []
    text = b""
    # see gc_paused; inline, as this runs for every sample
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if moved:
            # NOTE: the text fields first, with the same encoder (one set of repeat bounds and
            # alias indices): a tensor or array both parts hold gets its bytes in each part,
            # and loads as one object because the text part is decoded first.
            encoder.record = _Record(inline_limit, tensor_blobs, copy=copy)
            text_tree = {"f": encoder._dict({k: fields[k] for k in moved}, top=True)}
            text = _assemble(text_tree, encoder.record)
            encoder.record = record
            others = dict(fields)
            for k in moved:
                del others[k]
            # the fields in their order, the text fields marked where they were
            tree_fields = dict.fromkeys(fields, _TEXT_NODE)
            tree_fields.update(encoder._dict(others, top=True))
        else:
            tree_fields = encoder._dict(fields, top=True)
        tree: dict[str, Any] = {"c": name, "f": tree_fields}
        if converted is not None:
            # NOTE: added to the tree of `Sample` records (format version 1 unchanged; a
            # reader of an older release ignores it): the fields stored converted, so that a
            # None status or a dict in ``spec_info`` loads as it was saved
            # (docs/architecture/samples-and-values.md, "Samples and values").
            tree["s"] = converted
    except UnencodableError as exc:
        raise error_at(exc, "sample field ") from None
    finally:
        if was_enabled:
            gc.enable()
    kept = {k: fields[k] for k in keep if k in fields}
    return EncodedSample(_assemble(tree, record), tensor_blobs, text, kept)


def _assemble(tree: Any, record: _Record) -> bytes:
    """``tree_len u32 | tree | pad to 8 | arrays``."""
    tree_bytes = _dumps(tree)
    head_len = _TREE_LEN.size + len(tree_bytes)
    pad = -head_len % _ALIGN
    return b"".join([_TREE_LEN.pack(len(tree_bytes)), tree_bytes, b"\0" * pad, *record.arrays])


def decode_sample(
    rec: memoryview,
    loader: Callable[[str], torch.Tensor] | None,
    *,
    as_arrays: bool = False,
    text: memoryview | None = None,
    dtypes: Mapping[str, np.dtype] | None = None,
    in_place: bool = False,
    array_loader: Callable[[str], np.ndarray] | None = None,
) -> Any:
    """The sample in one (inflated) record, and its inflated text part if it has one.

    ``dtypes`` (with ``as_arrays``; checked by `check_dtypes`): the dtype of each named
    top-level numeric list field's array (`numbers_as`), instead of int64 or float64.

    ``in_place``: a writable ``rec`` or ``text`` is the caller's to give away (no one else
    holds or writes it): the numpy array or inline tensor holding at least half of it is
    a view of it, not a copy (docs/architecture/reading.md, "Arrays in place").

    ``loader`` gives the tensor of a tensor blob (a `TensorRef` calls it on first use),
    ``array_loader`` the numpy array of an array stored as a blob (called as it is decoded).

    Raises what it meets on damaged bytes (`IntegrityError`, and the ``struct``, ``json``,
    ``KeyError``... errors of malformed parts): the chunk reader names the record and turns
    them into `IntegrityError`.  `NotHeldError`: a value the dtype asked for cannot hold.
    """
    with gc_paused():
        return fields_to_sample(
            *decode_record(
                rec,
                loader,
                as_arrays=as_arrays,
                text=text,
                dtypes=dtypes,
                in_place=in_place,
                array_loader=array_loader,
            )
        )


class StoredNumbers(np.ndarray):
    """A numeric list field as the array the record stores (``decode_record(stored=True)``):
    the encoder's narrowed dtype, marked as a list so that a reader tells it from a field that
    held a numpy array.  A view of the record's bytes where no copy was needed."""


def record_class_name(rec: memoryview) -> str | None:
    """The class name a record's tree names (None for a dict sample), its fields undecoded."""
    tree, _ = _parse(rec)
    if type(tree) is not dict:
        raise IntegrityError("record tree is not a sample")
    name = tree.get("c")
    if name is not None and type(name) is not str:
        raise IntegrityError("record names a malformed sample class")
    return name


def decode_record(
    rec: memoryview,
    loader: Callable[[str], torch.Tensor] | None,
    *,
    as_arrays: bool = False,
    stored: bool = False,
    text: memoryview | None = None,
    dtypes: Mapping[str, np.dtype] | None = None,
    names: Collection[str] | None = None,
    in_place: bool = False,
    array_loader: Callable[[str], np.ndarray] | None = None,
) -> tuple[str | None, dict[str, Any], list[str] | None]:
    """One record as `sample_to_record` output: ``(class name, fields, converted)``.

    ``text`` is the record's inflated text part (chunk format version 2), if it has one.
    With ``stored``, numeric list fields come back as `StoredNumbers` (the Arrow export
    builds its columns from them without a Python object per number); otherwise as
    `decode_sample` gives them.  With ``names``, only those top-level fields are decoded
    (in the record's order; the arrays of the others are never touched), and ``text`` is
    needed only when one of them is a text field.  ``in_place`` and ``array_loader`` as
    `decode_sample`.  Raises as `decode_sample`.
    """
    tree, arrays = _parse(rec)
    if type(tree) is not dict or type(tree.get("f")) is not dict:
        raise IntegrityError("record tree is not a sample")
    name = tree.get("c")
    if name is not None and type(name) is not str:
        raise IntegrityError("record names a malformed sample class")
    converted = tree.get("s")
    if converted is not None and not (
        type(converted) is list and all(type(k) is str for k in converted)
    ):
        raise IntegrityError("record lists its converted fields malformed")

    def decoder_of(part: memoryview, part_arrays: memoryview) -> _Decoder:
        return _Decoder(
            part_arrays,
            loader,
            as_arrays=as_arrays or stored,
            stored=stored,
            dtypes=dtypes,
            whole=part.nbytes if in_place else None,
            array_loader=array_loader,
        )

    with gc_paused():
        decoder = decoder_of(rec, arrays)
        texts = None
        if text is not None:
            text_tree, text_arrays = _parse(text)
            text_node = text_tree.get("f") if type(text_tree) is dict else None
            if type(text_node) is not dict or _TAG in text_node:
                raise IntegrityError("record's text part is not a set of fields")
            # NOTE: one alias table for both parts: the encoder wrote the text part first
            # (see `encode_sample`), so a tensor both hold loads as one object.
            text_decoder = decoder_of(text, text_arrays)
            text_decoder.aliases = decoder.aliases
            texts = text_decoder.fields(text_node, names=names)
        fields = decoder.fields(tree["f"], texts, names)
    if type(fields) is not dict:
        raise IntegrityError("record fields are not a mapping")
    return name, fields, converted


def _parse(rec: memoryview) -> tuple[Any, memoryview]:
    """A record's tree (parsed) and its array section."""
    (tree_len,) = _TREE_LEN.unpack_from(rec, 0)
    tree_end = _TREE_LEN.size + tree_len
    if tree_end > rec.nbytes:
        raise IntegrityError("tree runs past the end of its record")
    tree = _TREE_DECODER.decode(
        bytes(rec[_TREE_LEN.size : tree_end]).decode("utf-8", "surrogatepass")
    )
    return tree, rec[tree_end + (-tree_end % _ALIGN) :]


def decode_fields(
    rec: memoryview,
    names: Collection[str],
    array_loader: Callable[[str], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Only the top-level fields ``names`` of one (inflated) record, decoded; the arrays of
    the other fields (token ids, log-probs, tensors) are never touched.  A field the record
    lacks is left out.  ``array_loader`` as `decode_sample`.  Raises as `decode_sample` does
    on damaged bytes."""
    tree, arrays = _parse(rec)
    if type(tree) is not dict:
        raise IntegrityError("record tree is not a sample")
    node = tree.get("f")
    if type(node) is not dict:
        raise IntegrityError("record tree is not a sample")
    decoder = _Decoder(arrays, None, array_loader=array_loader)
    if node.get(_TAG) == "map" and type(node.get("v")) is list:  # a dict sample with odd keys
        pairs = [(k, v) for k, v in node["v"] if type(k) is str and k in names]
    else:
        pairs = [(k, node[k]) for k in names if k in node and k != _TAG]
    return {k: decoder.decode(v) for k, v in pairs}


class _Decoder:
    """Rebuilds one sample's values from its tree and its record's array section."""

    def __init__(
        self,
        arrays: memoryview,
        loader: Callable[[str], torch.Tensor] | None,
        *,
        as_arrays: bool = False,
        stored: bool = False,
        dtypes: Mapping[str, np.dtype] | None = None,
        whole: int | None = None,
        array_loader: Callable[[str], np.ndarray] | None = None,
    ) -> None:
        """``whole``: the size of the record part ``arrays`` ends, when a writable part is
        given to the values decoded (``in_place``, see `decode_sample`)."""
        # NOTE: everything decodes from a read-only view, so that a list's array (as_arrays)
        # is still copied out of the record, as from bytes; only `_in_place` hands the part on.
        self.arrays = arrays.toreadonly()
        # the part's writable bytes, while no array holds them yet: one array per part is
        # a view of them (so views never overlap), and only one holding at least half the
        # part (so a loaded array never keeps more than as many bytes again alive)
        self.owned = arrays if whole is not None and not arrays.readonly else None
        self.whole = whole or 0
        self.loader = loader
        self.array_loader = array_loader
        self.as_arrays = as_arrays
        self.stored = stored
        self.dtypes = dtypes or {}
        # NOTE: the encoder gives every array its own bytes, so the descriptors of a record
        # never reference more than its array section; hostile ones that alias the same bytes
        # many times would otherwise multiply the memory a small blob decodes to.
        self.budget = arrays.nbytes
        # alias index -> (node kind, dtype, shape, blob digest, object): the tensor and array
        # nodes the encoder wrote for one tensor or view (``"a"``) load as one object;
        # records without it (older releases) load a separate object per node
        self.aliases: dict[int, tuple[Any, Any, Any, Any, Any]] = {}

    def _shared(self, node: dict[str, Any], build: Callable[[], Any]) -> Any:
        """The object a tensor or array node decodes to: one per alias index."""
        alias = node.get("a")
        if alias is None:
            return build()
        if type(alias) is not int:
            raise IntegrityError("malformed alias index")
        # NOTE: a blob's digest too: a second node naming another blob under the alias would
        # otherwise load the first blob's value, its own never read nor checked
        described = (node[_TAG], node["d"], node.get("sh"), node.get("h"))
        known = self.aliases.get(alias)
        if known is not None:
            if known[:4] != described:
                raise IntegrityError("nodes of one alias index describe different values")
            return known[4]
        value = build()
        self.aliases[alias] = (*described, value)
        return value

    def _slice(self, node: dict[str, Any]) -> memoryview:
        offset, nbytes = node["o"], node["n"]
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise IntegrityError("malformed array descriptor")
        if offset + nbytes > self.arrays.nbytes:
            raise IntegrityError("array runs past the end of its record")
        self.budget -= nbytes
        if self.budget < 0:
            raise IntegrityError("array descriptors reference more bytes than the record holds")
        return self.arrays[offset : offset + nbytes]

    def _in_place(self, node: dict[str, Any], nbytes: int) -> memoryview | None:
        """The writable bytes of a node `_slice` took, if its value may be a view of them
        (see ``owned``); None: copy them."""
        if self.owned is None or nbytes * 2 < self.whole:
            return None
        owned, self.owned = self.owned, None
        return owned[node["o"] : node["o"] + nbytes]

    def fields(
        self,
        node: Any,
        texts: dict[str, Any] | None = None,
        names: Collection[str] | None = None,
    ) -> Any:
        """The sample's fields; with ``as_arrays``, numeric list fields as numpy arrays.

        ``texts``: the fields decoded from the record's text part, put where the tree marks
        them (`_TEXT_NODE`); each must be marked once.  ``names``: only those fields (of a
        text part: those it holds), in the tree's order.
        """
        if texts is not None:
            if type(node) is not dict or _TAG in node:
                raise IntegrityError("record with a text part has no plain fields")
            out = {}
            for k, v in node.items():
                if names is not None and k not in names:
                    continue
                if type(v) in _LEAVES:
                    out[k] = v
                elif v == _TEXT_NODE:
                    if k not in texts:
                        raise IntegrityError(f"record's text part lacks field {k!r:.40}")
                    out[k] = texts.pop(k)
                else:
                    out[k] = self._field(v, k) if self.as_arrays else self.decode(v)
            if texts:
                raise IntegrityError("record's text part holds fields its tree does not mark")
            return out
        if names is not None and type(node) is dict and _TAG not in node:
            node = {k: v for k, v in node.items() if k in names}
        if not self.as_arrays or type(node) is not dict:
            return self.decode(node)
        tag = node.get(_TAG)
        if tag is None:
            return {k: self._field(v, k) for k, v in node.items()}
        if tag == "map" and type(node.get("v")) is list:  # a dict sample with odd keys
            out = {}
            for k, v in node["v"]:
                key = _hashable(self.decode(k))
                if names is None or key in names:
                    out[key] = self._field(v, key)
            return out
        return self.decode(node)

    def _field(self, node: Any, key: Any) -> Any:
        t = type(node)
        want = self.dtypes.get(key) if type(key) is str else None
        if t is dict and node.get(_TAG) == "list" and node.get("d") in _ARRAY_LIST_DTYPES:
            dtype = _NUMPY_DTYPES[node["d"]]
            arr = _unshuffle(self._slice(node), dtype, node["s"])
            if self.stored:
                return arr.view(StoredNumbers)
            if want is not None:
                return numbers_as(arr, want, key)
            # np.array(the saved list)'s dtype, and memory of its own (not a read-only view
            # that would keep the whole decompressed record alive).
            wide = np.int64 if dtype.kind in "iu" else np.float64
            return arr.astype(wide, copy=not arr.flags.writeable)
        value = self.decode(node)
        if type(value) is list and value:
            numbers = _number_array(value)
            if numbers is not None:
                if self.stored:
                    return numbers.view(StoredNumbers)
                return numbers if want is None else numbers_as(numbers, want, key)
        elif type(value) is list and not self.stored:
            # NOTE: an empty list records no dtype (it has no values to take one from): an
            # empty array of the dtype asked for, else np.array([])'s (float64), so that a
            # replay's torch.from_numpy takes an aborted sample's empty mask as a full one.
            return np.empty(0, dtype=np.float64 if want is None else want)
        return value

    def decode(self, node: Any) -> Any:
        t = type(node)
        # NOTE: leaves are taken as they are without a call: most of a sample's ~40 fields
        # and of its helper dicts' values are None, ints or strings
        if t is list:
            return [v if type(v) in _LEAVES else self.decode(v) for v in node]
        if t is not dict:
            if t in _LEAVES:
                return node
            raise IntegrityError(f"unexpected JSON value of type {t.__name__}")
        tag = node.get(_TAG)
        if tag is None:
            return {k: v if type(v) in _LEAVES else self.decode(v) for k, v in node.items()}
        if tag == "list":
            dtype = _NUMPY_DTYPES[node["d"]]
            data = self._slice(node)
            if _native_stored_list is not None:
                # NOTE: the items straight from the stored bytes: no array to un-shuffle
                # into and read again (a third of a list load's time went there)
                items = _native_stored_list(data, node["d"], node["s"])
                if items is not None:
                    return items
            return _unshuffle(data, dtype, node["s"]).tolist()
        if tag == "str":
            return bytes(self._slice(node)).decode("utf-8", "surrogatepass")
        if tag == "tuple":
            return tuple(self.decode(v) for v in node["v"])
        if tag == "map":
            return {_hashable(self.decode(k)): self.decode(v) for k, v in node["v"]}
        if tag == "tensor":
            return self._shared(node, lambda: self._tensor(node))
        if tag == "ref":
            return self._shared(
                node,
                lambda: TensorRef(
                    check_digest(node["h"]),
                    torch_dtypes()[node["d"]],
                    _check_shape(node["sh"]),
                    int(node["n"]),
                    self.loader,
                ),
            )
        if tag == "ndarray":
            return self._shared(node, lambda: self._ndarray(node["d"], node, own=True))
        if tag == "ndref":
            return self._shared(node, lambda: self._array_blob(node))
        if tag == "npscalar":
            return self._ndarray(node["d"], node["v"])[()]
        if tag == "npstr":
            text = self.decode(node["v"])
            if type(text) is not str:
                raise IntegrityError("a stored numpy string is malformed")
            return np.str_(text)
        if tag == "npbytes":
            return np.bytes_(bytes(self._slice(node)))
        if tag == "ndobj":
            return self._object_array(node)
        if tag == "bytes":
            return bytes(self._slice(node))
        if tag == "bytearray":
            return bytearray(self._slice(node))
        if tag == "image":
            return _decode_image(node, self._slice(node), self.decode)
        if tag == "enum":
            if type(node.get("c")) is not str:
                raise IntegrityError("an enum value names a malformed class")
            return record_to_enum(node["c"], self.decode(node["v"]))
        if tag == "obj":
            fields = self.decode(node["f"])
            if type(node.get("c")) is not str or type(fields) is not dict:
                raise IntegrityError("a stored object is malformed")
            return record_to_value(node["c"], fields)
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

    def _object_array(self, node: dict[str, Any]) -> np.ndarray:
        shape = _check_shape(node["sh"])
        items = node["v"]
        if type(items) is not list or len(items) != math.prod(shape):
            raise IntegrityError("a stored object array's items do not match its shape")
        out = np.empty(len(items), dtype=object)
        for i, item in enumerate(items):
            # NOTE: item by item: np.array(list) would turn nested lists into more dimensions.
            out[i] = self.decode(item)
        return out.reshape(shape)

    def _ndarray(self, dtype_name: str, node: dict[str, Any], *, own: bool = False) -> np.ndarray:
        """The array a node stores: a read-only view of the record, or with ``own`` an array
        of its own (writable, not keeping the record alive) or in place (`_in_place`)."""
        dtype = _array_dtype(dtype_name)
        shape = _check_shape(node["sh"])
        mv = self._slice(node)
        if math.prod(shape) * dtype.itemsize != mv.nbytes:
            raise IntegrityError("numpy array size does not match its stored bytes")
        if dtype.itemsize == 0:
            return np.zeros(shape, dtype)  # np.array(["", ""]) is "<U1"; np.array([], "U") is not
        if not own:
            return np.frombuffer(mv, dtype=dtype).reshape(shape)
        placed = self._in_place(node, mv.nbytes)
        if placed is not None:
            return np.frombuffer(placed, dtype=dtype).reshape(shape)
        return np.frombuffer(mv, dtype=dtype).reshape(shape).copy()

    def _array_blob(self, node: dict[str, Any]) -> np.ndarray:
        """The array a blob holds (an ``ndref`` node), read as it is decoded: an array is
        never a proxy, as a `TensorRef` is, since numpy hands nothing a use to hook."""
        digest = check_digest(node["h"])
        dtype = _NUMPY_DTYPES.get(node["d"]) if type(node["d"]) is str else None
        shape = _check_shape(node["sh"])
        if dtype is None:
            raise IntegrityError(f"a stored numpy array has a malformed dtype {node['d']!r:.40}")
        if self.array_loader is None:
            raise InvalidInputError(
                f"the numpy array of blob {digest} needs an array_loader to be read"
            )
        arr = self.array_loader(digest)
        if arr.dtype != dtype or arr.shape != shape:
            raise IntegrityError(
                f"tensor blob {digest} holds {arr.dtype}{list(arr.shape)}, "
                f"its reference says {dtype}{list(shape)}"
            )
        return arr

    def _tensor(self, node: dict[str, Any]) -> torch.Tensor:
        mv = self._slice(node)
        dtype, shape = torch_dtypes()[node["d"]], _check_shape(node["sh"])
        placed = self._in_place(node, mv.nbytes)
        if placed is not None:
            return _tensor_from(placed, dtype, shape, exact=True, owned=True)
        return _tensor_from(mv, dtype, shape, exact=True)


# The JSON values a tree's node decodes to as they are.
_LEAVES = frozenset({str, int, float, bool, type(None)})

# The stored dtypes of numeric lists whose values int64 or float64 hold exactly (the encoder
# writes no others; anything else is decoded as a list and judged by its values).
_ARRAY_LIST_DTYPES = frozenset(
    {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float32", "float64"}
)


def _number_array(values: list[Any]) -> np.ndarray | None:
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
