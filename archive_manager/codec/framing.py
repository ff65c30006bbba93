"""Blob framing: the header every codec blob starts with, the kinds of blobs, bounded zstd
frames, and the manifest blob's bytes.

Every blob the codec writes begins with ``magic (8 bytes) | version u16 | flags u16 | u32``
(little-endian); the magic tells a chunk, a tensor blob and a manifest apart from their first
`MAGIC_SIZE` bytes (GC and recovery read only those).  A manifest blob is that header (the u32
is the JSON's length) followed by one zstd frame of the manifest's JSON.
"""

from __future__ import annotations

import json
import struct
import threading
from typing import Any

import zstandard

from .._util.digest import Buffer
from ..errors import (
    ArchiveError,
    ArchiveReleasedError,
    IntegrityError,
    MissingDependencyError,
    UnsupportedFormatError,
)

__all__ = [
    "BLOB_VERSION",
    "CHUNK_MAGIC",
    "FORMAT_VERSION",
    "MAGIC_SIZE",
    "MANIFEST_MAGIC",
    "TENSOR_MAGIC",
    "blob_kind",
    "decode_manifest",
    "encode_manifest",
]

CHUNK_MAGIC = b"AMCHUNK\x00"
TENSOR_MAGIC = b"AMTENSR\x00"
MANIFEST_MAGIC = b"AMMANIF\x00"
#: The newest blob format version this library writes: chunks of version 2 hold each record's
#: text part apart (docs/architecture/chunk-format.md, "Chunk format").  Tensor and manifest blobs,
#: whose layout did not change, are still written as version 1: their bytes (and digests) stay what
#: every release wrote, and releases that read only version 1 read them.
FORMAT_VERSION = 2
#: The version tensor and manifest blobs are written and read at.
BLOB_VERSION = 1

_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, count

# NOTE: the encoder only compresses a record when raw <= stored * _MAX_RATIO + _RATIO_SLACK, and
# the decoder rejects anything else: hostile bytes can then never make it allocate more than a
# bounded multiple of the blob they came in.
_MAX_RATIO = 4096
_RATIO_SLACK = 1 << 16
_ZSTD_LEVEL = 1

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


def _check_magic(
    magic: bytes, want: bytes, version: int, what: str, versions: tuple[int, ...] = (BLOB_VERSION,)
) -> None:
    if magic != want:
        raise UnsupportedFormatError(f"{what} is not in archive_manager's format (bad magic)")
    if version not in versions:
        known = " and ".join(map(str, versions))
        raise UnsupportedFormatError(
            f"{what} has format version {version}; this library reads version {known} "
            "(upgrade archive_manager)"
        )


def _integrity(what: str, exc: BaseException) -> ArchiveError:
    if isinstance(exc, (MissingDependencyError, ArchiveReleasedError)):
        # A tensor met on a lean install (no torch extra): the record is sound, the install
        # lacks a package, and the error says which.  An array blob reclaimed with its
        # released archive while the record was read: the record is sound, the archive gone.
        return exc
    if isinstance(exc, (IntegrityError, UnsupportedFormatError)):
        if type(exc) in (IntegrityError, UnsupportedFormatError) and not str(exc).startswith(what):
            # name the blob (and record) the error is about
            return type(exc)(f"{what}: {exc}")
        return exc
    return IntegrityError(f"{what} is malformed: {type(exc).__name__}: {exc}")


_KINDS = {CHUNK_MAGIC: "chunk", TENSOR_MAGIC: "tensor", MANIFEST_MAGIC: "manifest"}
MAGIC_SIZE = len(CHUNK_MAGIC)


def blob_kind(head: bytes) -> str | None:
    """``"chunk"``, ``"tensor"`` or ``"manifest"`` from a blob's first `MAGIC_SIZE` bytes."""
    return _KINDS.get(bytes(head[:MAGIC_SIZE]))


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """An archive's manifest (plain JSON-able dict) as blob bytes: magic, version, zstd(JSON)."""
    body = json.dumps(manifest, separators=(",", ":"), allow_nan=True).encode()
    return _HEAD.pack(MANIFEST_MAGIC, BLOB_VERSION, 0, len(body)) + _compressor().compress(body)


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
