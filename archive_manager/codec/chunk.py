"""The chunk format: up to a chunk's worth of consecutive samples of one archive in one blob.

Chunk blob layout (little-endian)::

    magic "AMCHUNK\\0" | version u16 | flags u16 | n u32 | n x (offset u64, stored u64, raw u64,
    method u8, pad 7) | records...

Each record holds one sample (`values`), compressed with zstd as a whole unless that does not
pay.  Decoding one sample therefore touches only its own record: the index is at a fixed
place, so a reader can seek (or slice a memory map) straight to it.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zstandard

from .._digest import Buffer, digest_of
from ..errors import ArchiveError, IntegrityError, UnsupportedFormatError
from .framing import (
    _HEAD,
    _MAX_RATIO,
    _RATIO_SLACK,
    CHUNK_MAGIC,
    FORMAT_VERSION,
    _check_frame,
    _check_magic,
    _compressor,
    _decompressor,
    _inflate,
    _integrity,
)
from .tensors import TensorBlob
from .values import (
    DEFAULT_INLINE_LIMIT,
    EncodedSample,
    _gc_paused,
    decode_fields,
    decode_record,
    decode_sample,
    encode_sample,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ChunkReader",
    "EncodedChunk",
    "GilHandOver",
    "RawChunk",
    "build_chunk",
    "decode_chunk",
    "encode_chunk",
]

_INDEX = struct.Struct("<QQQB7x")  # offset, stored length, raw length, method
_RAW, _ZSTD = 0, 1


@dataclass
class EncodedChunk:
    """A chunk blob ready to store, with the tensor blobs it references."""

    data: bytes
    digest: str
    samples: int
    tensor_blobs: dict[str, TensorBlob] = field(default_factory=dict)


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
        # NOTE: zstandard's stubs omit the list-of-bytes input its documentation allows, and
        # the result's iteration; both are what it does at run time.
        frames: Any = (
            _compressor().multi_compress_to_buffer(records)  # type: ignore[arg-type]
            if records
            else []
        )
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
            out: Any = _decompressor().multi_decompress_to_buffer(
                frames,  # type: ignore[arg-type]  # a list of buffers, as documented
                decompressed_sizes=struct.pack(f"<{len(sizes)}Q", *sizes),
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
        return self._decode(i, lambda rec: decode_sample(rec, self.loader, as_arrays=as_arrays))

    def record(self, i: int) -> tuple[str | None, dict[str, Any], list[str] | None]:
        """The record at offset ``i`` as ``(class name, fields, converted)``, numeric list
        fields as `StoredNumbers` (see `decode_record`); errors as `sample`."""
        return self._decode(i, lambda rec: decode_record(rec, self.loader, stored=True))

    def fields(
        self, i: int, names: Collection[str], *, require: re.Pattern[bytes] | None = None
    ) -> dict[str, Any] | None:
        """Only the top-level fields ``names`` of the sample at offset ``i`` (a search reads
        its texts so, without decoding token ids or log-probs); missing ones are left out.

        With ``require``, None unless the record's inflated bytes hold a match of it: nothing
        is decoded for a record that cannot hold what a search looks for.
        """

        def decode(rec: memoryview) -> dict[str, Any] | None:
            if require is not None and require.search(rec) is None:
                return None
            return decode_fields(rec, names)

        return self._decode(i, decode)  # type: ignore[no-any-return]

    def _decode(self, i: int, decode: Callable[[memoryview], Any]) -> Any:
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {self.digest} has {self._count} samples, not {i + 1}")
        what = f"chunk blob {self.digest}, record {i}"
        try:
            return decode(self._record(i))
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
