"""The tensor-blob format, and the dtype names and shape rules every stored tensor follows.

A tensor blob is ``magic "AMTENSR\\0" | version u16 | flags u16 | header_len u32 | header
(JSON: dtype, shape; space-padded to 64 bytes) | the tensor's bytes as they are in memory``.
Tensors at most the inline limit are kept inside their chunk's record instead (see
`values`), with the same dtype names and the same limits.  A numeric numpy array above the
inline limit is a blob of this same format (`encode_array_blob`), read back by numpy alone
(`decode_array_blob`): an array and a tensor of one dtype, shape and bytes are one blob.

torch is imported by the first function here that is given or asked for a tensor
(docs/architecture/index.md, "Layers"): the dtype tables are built then, not at import.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._util.digest import Buffer, digest_of
from .._util.lazy_torch import torch_module
from ..errors import ArchiveError, IntegrityError, UnencodableError
from .framing import BLOB_VERSION, TENSOR_MAGIC, _check_magic, _integrity

if TYPE_CHECKING:
    import torch
    from torch import Tensor  # what a function whose local `torch` is torch_module() names

__all__ = [
    "NUMPY_DTYPES",
    "TensorBlob",
    "decode_array_blob",
    "decode_tensor_blob",
    "encode_array_blob",
    "encode_tensor_blob",
]

_TENSOR_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, header length

# One rule for both sides: the encoder refuses what the decoder would refuse as corrupt.
_MAX_DIMS = 64

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


#: The stored dtype names numpy has, to its dtypes (little-endian, as blobs and records hold
#: them).
NUMPY_DTYPES = {name: dt for name in _DTYPE_NAMES if (dt := _numpy_dtype(name)) is not None}


@functools.cache
def torch_dtypes() -> dict[str, torch.dtype]:
    """The stored dtype names torch has, to its dtypes (torch is imported here)."""
    torch = torch_module()
    return {name: getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name)}


@functools.cache
def torch_dtype_names() -> dict[torch.dtype, str]:
    """The inverse of `torch_dtypes`: the name each storable torch dtype is stored under."""
    return {v: k for k, v in torch_dtypes().items()}


@dataclass
class TensorBlob:
    """A tensor (or numpy array) to be stored as its own blob: the parts to write (its
    header, then its bytes), their digest, and the shape and bytes of the values."""

    digest: str
    parts: list[Buffer]
    size: int
    shape: list[int]
    nbytes: int


def _check_storable(t: torch.Tensor) -> None:
    """Refuse a tensor no tensor blob or record can hold (its layout, rank, dtype, device).

    Raises:
        UnencodableError: naming what is refused.
    """
    torch = torch_module()
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise UnencodableError(f"cannot store a {kind} tensor; convert it to dense first")
    if t.dim() > _MAX_DIMS:
        raise UnencodableError(
            f"cannot store a tensor of {t.dim()} dimensions (at most {_MAX_DIMS})"
        )
    if t.is_quantized or t.dtype not in torch_dtype_names():
        raise UnencodableError(f"cannot store a tensor of dtype {t.dtype}")
    if t.device.type == "meta":
        raise UnencodableError("cannot store a tensor on the meta device: it holds no data")


def _tensor_bytes(t: torch.Tensor) -> tuple[torch.Tensor, memoryview]:
    """The tensor's raw bytes, without copying a contiguous CPU tensor."""
    torch = torch_module()
    _check_storable(t)
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
    # ndarray has the buffer protocol; numpy's stubs declare it only for Python 3.12+.
    return t, memoryview(flat.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]


def encode_tensor_blob(t: torch.Tensor) -> TensorBlob:
    """A tensor as a standalone blob: a small header, then its bytes as they are in memory."""
    t, raw = _tensor_bytes(t)
    return _blob(torch_dtype_names()[t.dtype], list(t.shape), raw)


def encode_array_blob(arr: np.ndarray) -> TensorBlob:
    """A numeric numpy array (a dtype of `NUMPY_DTYPES`, little-endian) as a standalone
    blob: the tensor blob of a tensor of its dtype, shape and values."""
    name = arr.dtype.name
    if NUMPY_DTYPES.get(name) != arr.dtype:
        raise UnencodableError(f"cannot store a numpy array of dtype {arr.dtype} as a blob")
    if arr.ndim > _MAX_DIMS:
        raise UnencodableError(
            f"cannot store a numpy array of {arr.ndim} dimensions (at most {_MAX_DIMS})"
        )
    # NOTE: copy(order="C"), not ascontiguousarray, which makes a 0-d array 1-d.
    flat = arr if arr.flags.c_contiguous else arr.copy(order="C")
    # ndarray has the buffer protocol; numpy's stubs declare it only for Python 3.12+.
    raw = memoryview(flat.reshape(-1).view(np.uint8)) if flat.size else memoryview(b"")  # type: ignore[arg-type]
    return _blob(name, list(arr.shape), raw)


def _blob(dtype: str, shape: list[int], raw: memoryview) -> TensorBlob:
    header = json.dumps({"dtype": dtype, "shape": shape}, separators=(",", ":")).encode()
    header += b" " * (-(len(header) + _TENSOR_HEAD.size) % 64)
    head = _TENSOR_HEAD.pack(TENSOR_MAGIC, BLOB_VERSION, 0, len(header)) + header
    parts: list[Buffer] = [head, raw]
    return TensorBlob(digest_of(parts), parts, len(head) + raw.nbytes, shape, raw.nbytes)


def _parse_blob(mv: memoryview, digest: str) -> tuple[str, tuple[int, ...], memoryview]:
    """A tensor blob's dtype name, shape and bytes (their size unchecked)."""
    magic, version, _flags, hlen = _TENSOR_HEAD.unpack_from(mv, 0)
    _check_magic(magic, TENSOR_MAGIC, version, f"tensor blob {digest}")
    start = _TENSOR_HEAD.size + hlen
    if start > mv.nbytes:
        raise IntegrityError("header runs past the end of the blob")
    header = json.loads(bytes(mv[_TENSOR_HEAD.size : start]))
    if type(header) is not dict or type(header.get("dtype")) is not str:
        raise IntegrityError("malformed tensor blob header")
    return header["dtype"], _check_shape(header["shape"]), mv[start:]


def decode_tensor_blob(data: Buffer, digest: str = "?", *, owned: bool = False) -> torch.Tensor:
    """The tensor in a tensor blob, as a new writable tensor: a copy of the blob's bytes, or,
    with ``owned`` (``data`` is a writable buffer nobody else uses: `BlobStore.open_private`),
    a tensor over ``data`` itself, which it keeps alive."""
    mv = memoryview(data).cast("B")
    try:
        name, shape, raw = _parse_blob(mv, digest)
        return _tensor_from(raw, torch_dtypes()[name], shape, exact=True, owned=owned)
    except (ArchiveError, UnicodeDecodeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc


def decode_array_blob(data: Buffer, digest: str = "?", *, owned: bool = False) -> np.ndarray:
    """The numpy array in a tensor blob (torch is not imported): a writable copy of the
    blob's bytes, or, with ``owned`` (as `decode_tensor_blob`), an array over ``data``
    itself, which it keeps alive.  A dtype numpy lacks (bfloat16, float8) is an
    `IntegrityError`: no array was stored so."""
    mv = memoryview(data).cast("B")
    try:
        name, shape, raw = _parse_blob(mv, digest)
        dtype = NUMPY_DTYPES.get(name)
        if dtype is None:
            raise IntegrityError(f"holds a {name} tensor, which numpy cannot hold")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != raw.nbytes:
            raise IntegrityError(f"tensor of {nbytes} bytes does not fit {raw.nbytes} stored bytes")
        # bytearray: as `_tensor_from`, the array owns writable memory of its own
        arr: np.ndarray = np.frombuffer(raw if owned else bytearray(raw), dtype=dtype)
        return arr.reshape(shape)
    except (ArchiveError, UnicodeDecodeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise _integrity(f"tensor blob {digest}", exc) from exc


def _tensor_from(
    mv: memoryview,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    *,
    exact: bool = False,
    owned: bool = False,
) -> torch.Tensor:
    torch = torch_module()
    itemsize = dtype.itemsize  # (not a 0-d tensor's element_size: 10 us a tensor loaded)
    nbytes = math.prod(shape) * itemsize
    if nbytes > mv.nbytes or (exact and nbytes != mv.nbytes):
        raise IntegrityError(f"tensor of {nbytes} bytes does not fit {mv.nbytes} stored bytes")
    if nbytes == 0:
        empty: Tensor = torch.empty(shape, dtype=dtype)
        return empty
    # bytearray: the tensor must own writable memory, not alias a read-only chunk or mmap
    # (an owned buffer is writable and the tensor's alone).
    flat = torch.frombuffer(mv[:nbytes] if owned else bytearray(mv[:nbytes]), dtype=torch.uint8)
    tensor: Tensor = flat.view(dtype).reshape(shape)
    return tensor


def _check_shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise IntegrityError(f"malformed tensor shape {shape!r:.80}")
    if len(shape) > _MAX_DIMS:
        raise IntegrityError("tensor has too many dimensions")
    return tuple(shape)
