"""Samples <-> chunk bytes, tensor blobs and blob framing.  No catalog, no file I/O, no pickle.

One module per seam (docs/architecture/index.md, "Layers"):

* `framing`: the header every blob starts with, blob kinds, bounded zstd frames, the
  manifest blob's bytes;
* `tensors`: the tensor-blob format, the stored dtype names and shape limits;
* `tensor_ref`: `TensorRef`, the lazy proxy of a tensor blob, and `materialize_tensor_refs`;
* `values`: the value encoder and decoder (one sample <-> one record);
* `chunk`: the chunk format (records, index, compression) and its random-access reader.

torch is imported only where a tensor is encoded or decoded (`archive_manager._util.lazy_torch`): a
rollout without tensors is saved and loaded without it.

Other components import the public names below; the private helpers re-exported here are
for the codec's own tests, which patch them on this module (see `_Codec`).
"""

# ruff: noqa: F401
# (this module re-exports: every name imported here is one callers import from it)

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from .._util.digest import Buffer, digest_of
from ..errors import ArchiveError, IntegrityError, UnencodableError, UnsupportedFormatError
from . import chunk, framing, tensor_ref, tensors, values
from .chunk import (
    _INDEX,
    _INDEX2,
    _RAW,
    _ZSTD,
    CHUNK_VERSIONS,
    ChunkReader,
    EncodedChunk,
    GilHandOver,
    RawChunk,
    _pack,
    _pack_all,
    build_chunk,
    decode_chunk,
    encode_chunk,
    read_records,
)
from .framing import (
    _HEAD,
    _MAX_RATIO,
    _RATIO_SLACK,
    BLOB_VERSION,
    CHUNK_MAGIC,
    FORMAT_VERSION,
    MAGIC_SIZE,
    MANIFEST_MAGIC,
    TENSOR_MAGIC,
    _check_frame,
    _check_magic,
    _compressor,
    _decompressor,
    _inflate,
    _integrity,
    blob_kind,
    decode_manifest,
    encode_manifest,
)
from .tensor_ref import TensorRef, _materialized, materialize_tensor_refs
from .tensors import (
    _DTYPE_NAMES,
    _MAX_DIMS,
    TensorBlob,
    _check_shape,
    _tensor_bytes,
    _tensor_from,
    decode_array_blob,
    decode_tensor_blob,
    encode_array_blob,
    encode_tensor_blob,
    torch_dtype_names,
    torch_dtypes,
)
from .tensors import NUMPY_DTYPES as _NUMPY_DTYPES
from .values import (
    _MAX_REPEATED_ITEMS,
    _TREE_LEN,
    DEFAULT_INLINE_LIMIT,
    TEXT_FIELDS,
    EncodedSample,
    StoredNumbers,
    TakenList,
    _Decoder,
    _Encoder,
    _marshalled_numbers,
    _native_dict_items,
    _native_first_leaves,
    _native_numbers,
    _native_stored_list,
    _number_array,
    _Record,
    decode_fields,
    decode_record,
    decode_sample,
    encode_sample,
    error_at,
    gc_paused,
    key_text,
)

__all__ = [
    "DEFAULT_INLINE_LIMIT",
    "ChunkReader",
    "EncodedChunk",
    "EncodedSample",
    "GilHandOver",
    "RawChunk",
    "StoredNumbers",
    "TakenList",
    "TensorBlob",
    "TensorRef",
    "build_chunk",
    "decode_array_blob",
    "decode_chunk",
    "decode_fields",
    "decode_manifest",
    "decode_record",
    "decode_sample",
    "decode_tensor_blob",
    "encode_array_blob",
    "encode_chunk",
    "encode_manifest",
    "encode_sample",
    "encode_tensor_blob",
    "materialize_tensor_refs",
    "read_records",
]

_SEAMS = (framing, tensors, tensor_ref, values, chunk)


class _Codec(ModuleType):
    """The package module: an attribute set here is set where the code that uses it looks.

    NOTE: tests replace private helpers on this module (``codec._marshalled_numbers = ...``,
    ``monkeypatch.setattr(codec, "_inflate", ...)``) as they did when the codec was one file;
    the functions that call those helpers now live in the seam modules, which look them up in
    their own globals.  Setting the name in every seam module that binds it keeps such a patch
    (and its undo) effective.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        for seam in _SEAMS:
            if name in seam.__dict__:
                setattr(seam, name, value)


sys.modules[__name__].__class__ = _Codec
