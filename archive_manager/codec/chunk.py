"""The chunk format: up to a chunk's worth of consecutive samples of one archive in one blob.

Chunk blob layout (little-endian; docs/architecture/chunk-format.md, "Chunk format")::

    magic "AMCHUNK\\0" | version u16 (2) | flags u16 | n u32 | n x (offset u64,
    text stored u64, text raw u64, rest stored u64, rest raw u64, text method u8,
    rest method u8, pad 6, xxh3-64 u64) | records...

Each record holds one sample in two parts, stored back to back from ``offset``: its text part
(the `TEXT_FIELDS`, prompt and response, as a record of their own; none when raw is 0) and the
rest, each compressed with zstd as a frame of its own unless that does not pay.  A search
inflates only text parts; decoding one sample touches only its own record, whose stored bytes
the xxh3-64 checks (so one record read by a ranged read can be verified without the chunk).
The index is at a fixed place, so a reader can seek (or slice a memory map) straight to it.

Version 1 (every chunk written before; still read, and written by ``version=1``)::

    magic | version u16 (1) | flags u16 | n u32 | n x (offset u64, stored u64, raw u64,
    method u8, pad 7) | records...

with each record the whole sample in one frame.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import xxhash
import zstandard

from .._util.digest import Buffer, digest_of
from .._util.filemap import map_truncated
from ..errors import ArchiveError, IntegrityError, InvalidInputError, UnsupportedFormatError
from ._accel import native_hand_over, native_texts_holding
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
    TEXT_FIELDS,
    EncodedSample,
    decode_fields,
    decode_record,
    decode_sample,
    encode_sample,
    gc_paused,
    record_class_name,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHUNK_VERSIONS",
    "BytesNeedle",
    "ChunkReader",
    "EncodedChunk",
    "GilHandOver",
    "Needle",
    "RawChunk",
    "build_chunk",
    "decode_chunk",
    "encode_chunk",
    "read_records",
]

_INDEX = struct.Struct("<QQQB7x")  # version 1: offset, stored length, raw length, method
# version 2: offset, text stored, text raw, rest stored, rest raw, text method, rest method,
# xxh3-64 of the record's stored bytes (text part, then rest)
_INDEX2 = struct.Struct("<QQQQQBB6xQ")
# the same entries, for reading a whole index at once (`ChunkReader.search_texts`)
_INDEX2_ARRAY = np.dtype(
    [
        ("offset", "<u8"),
        ("t_stored", "<u8"),
        ("t_raw", "<u8"),
        ("r_stored", "<u8"),
        ("r_raw", "<u8"),
        ("t_method", "u1"),
        ("r_method", "u1"),
        ("pad", "V6"),
        ("checksum", "<u8"),
    ]
)
assert _INDEX2_ARRAY.itemsize == _INDEX2.size
_RAW, _ZSTD = 0, 1
#: The chunk format versions this library reads.
CHUNK_VERSIONS = (1, 2)
#: A record part that inflates to at least this many bytes is inflated into a buffer of its
#: own (`_inflate_into`), which the values decoded from it may keep (a numpy array holding
#: most of it is a view of it, docs/architecture/reading.md "Arrays in place"); smaller ones
#: are inflated together in one zstd call.
_OWN_MIN = 256 << 10
#: At most this many threads inflate a chunk's large parts at once (fewer where the process
#: may run on fewer CPUs).
_INFLATE_THREADS = 4


class Needle(Protocol):
    """What `ChunkReader.fields` looks for in a record's bytes: a compiled bytes pattern, or
    anything with its ``search`` (None when absent)."""

    def search(self, data: Buffer, /) -> object | None: ...


def _holding_py(
    parts: Iterable[Buffer], needle: bytes, folded: bool, also: tuple[bytes, ...]
) -> list[int]:
    """The indices of ``parts`` holding ``needle`` (in the part ASCII lower-cased when
    ``folded``: ``bytes.lower`` changes A-Z only) or any of ``also`` as they are: the rule of
    the C prefilter (``_native.texts_holding``), which the tests hold to this one."""
    out = []
    for i, part in enumerate(parts):
        raw = bytes(part)
        if (raw.lower() if folded else raw).find(needle) >= 0 or any(a in raw for a in also):
            out.append(i)
    return out


_texts_holding = native_texts_holding or _holding_py


@dataclass(frozen=True)
class BytesNeedle:
    """Bytes a record must hold to be decoded by a search (docs/architecture/search.md, "Search"):
    ``needle`` (searched ASCII case-folded when ``folded``, then given lower-case), or any
    of ``also`` byte for byte.  A `Needle`; `ChunkReader.search_texts` searches a chunk's
    text parts for it in one C call that releases the GIL."""

    needle: bytes
    folded: bool = False
    also: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if self.folded and self.needle != self.needle.lower():
            raise ValueError("a folded needle is given lower-case")

    def search(self, data: Buffer, /) -> object | None:
        return True if self.holding([data]) else None

    def holding(self, parts: Sequence[Buffer]) -> list[int]:
        """The indices of ``parts`` that hold the needle."""
        return _texts_holding(parts, self.needle, self.folded, self.also)


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


def _inflate_into(body: memoryview, raw_len: int) -> memoryview:
    """`_inflate` into a new writable buffer that nothing else holds, so the values decoded
    from it may keep it rather than copy out of it.  The same checks: the frame's sizes
    against the bound before anything is allocated, then exactly ``raw_len`` bytes, the
    frame ending there."""
    _check_frame(body, raw_len)
    out = np.empty(raw_len, np.uint8)
    got = 0
    with _decompressor().stream_reader(body) as stream:
        while got < raw_len:
            n = stream.readinto(out[got:])
            if not n:
                break
            got += n
        if got != raw_len or stream.read(1):
            raise IntegrityError("data decompressed to the wrong length")
    return out.data


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _inflate_many(parts: list[tuple[memoryview, int]]) -> list[memoryview | None]:
    """`_inflate_into` of each ``(frame, raw length)``, on up to `_INFLATE_THREADS` threads
    (this one included; zstd releases the GIL); None for a part that fails, which its
    record's decode then inflates again and names.

    NOTE: the threads are started per call, not kept in a pool: a pool's threads do not
    survive a fork (DataLoader workers), and a start costs ~0.1 ms against the >= 0.3 ms of
    inflating one such part.
    """
    out: list[memoryview | None] = [None] * len(parts)
    # largest first, so the threads finish together; list.pop is atomic under the GIL
    left = sorted(range(len(parts)), key=lambda j: parts[j][1])

    def work() -> None:
        while left:
            try:
                j = left.pop()
            except IndexError:  # another thread took the last one
                return
            # a part that fails stays None: its record's decode inflates it and names it
            with contextlib.suppress(ArchiveError, zstandard.ZstdError, ValueError, MemoryError):
                out[j] = _inflate_into(*parts[j])

    helpers: list[threading.Thread] = []
    for _ in range(min(_INFLATE_THREADS, _cpus(), len(parts)) - 1):
        helper = threading.Thread(target=work, name="archive-inflate", daemon=True)
        try:
            helper.start()
        except RuntimeError:  # interpreter shutdown takes no new threads: this one does all
            break
        helpers.append(helper)
    try:
        work()
    finally:
        for helper in helpers:
            helper.join()
    return out


@dataclass
class RawChunk:
    """A chunk's records, built but not yet compressed.

    Building needs the GIL; `pack` (zstd, join, hash) mostly does not, so a writer can pack
    and store chunk i on an I/O thread while it builds chunk i+1.  ``records[i]`` is record
    i's rest and ``texts[i]`` its text part (see `EncodedSample`; missing ones are empty).
    """

    records: list[bytes]
    tensor_blobs: dict[str, TensorBlob]
    texts: list[bytes] = field(default_factory=list)

    def add(self, encoded: EncodedSample) -> None:
        """Append one encoded sample (see `encode_sample`)."""
        self.texts.extend([b""] * (len(self.records) - len(self.texts)))
        self.records.append(encoded.record)
        self.texts.append(encoded.text)
        for digest, blob in encoded.tensor_blobs.items():
            self.tensor_blobs.setdefault(digest, blob)

    def pack(self, *, version: int = FORMAT_VERSION) -> EncodedChunk:
        """Compress the records and assemble the chunk blob (format ``version``: 1 only for
        records without text parts, as `build_chunk` makes them for it)."""
        texts = self.texts + [b""] * (len(self.records) - len(self.texts))
        if version == 1:
            if any(texts):
                raise ValueError("a chunk of format version 1 holds no text parts")
            return self._pack_v1()
        if version != 2:
            raise ValueError(f"cannot write chunk format version {version}")
        n = len(self.records)
        # NOTE: one zstd call for the texts and rests of all records (see `_pack_all`); an
        # empty text part (a sample without prompt and response) is stored as nothing.
        which = [i for i, text in enumerate(texts) if text]
        packed = _pack_all([texts[i] for i in which] + self.records)
        text_parts: list[tuple[Buffer, int, int]] = [(b"", 0, _RAW)] * n
        for i, part in zip(which, packed, strict=False):
            text_parts[i] = part
        rests = packed[len(which) :]
        offset = _HEAD.size + _INDEX2.size * n
        index = []
        body: list[Buffer] = []
        for (text, text_raw, text_method), (rest, rest_raw, rest_method) in zip(
            text_parts, rests, strict=True
        ):
            h = xxhash.xxh3_64()
            h.update(text)
            h.update(rest)
            text_len, rest_len = memoryview(text).nbytes, memoryview(rest).nbytes
            index.append(
                _INDEX2.pack(
                    offset,
                    text_len,
                    text_raw,
                    rest_len,
                    rest_raw,
                    text_method,
                    rest_method,
                    h.intdigest(),
                )
            )
            body += [text, rest]
            offset += text_len + rest_len
        data = b"".join([_HEAD.pack(CHUNK_MAGIC, 2, 0, n), *index, *body])
        return EncodedChunk(data, digest_of(data), n, self.tensor_blobs)

    def _pack_v1(self) -> EncodedChunk:
        records = _pack_all(self.records)
        offset = _HEAD.size + _INDEX.size * len(records)
        index = []
        for stored, raw_len, method in records:
            index.append(_INDEX.pack(offset, memoryview(stored).nbytes, raw_len, method))
            offset += memoryview(stored).nbytes
        data = b"".join(
            [_HEAD.pack(CHUNK_MAGIC, 1, 0, len(records)), *index]
            + [stored for stored, _, _ in records]
        )
        return EncodedChunk(data, digest_of(data), len(records), self.tensor_blobs)


# Seconds of encoding between two hand-overs of the GIL (see build_chunk).  Measured on the
# 1024-sample save: a hand-over per sample 0.35 s, every 0.5 ms or 2 ms 0.28 s.
_HAND_OVER_EVERY = 0.001
# Nanoseconds a hand-over yields for, at most, for a thread that waits for the GIL to take
# it: with 200 us allowed, such a thread took it within ~35 us in 9 of 10 hand-overs
# (realistic-1024 saves, load ~7).  A hand-over that no thread wanted costs all of it.
_HAND_OVER_SPIN_NS = 50_000


def build_chunk(
    samples: Sequence[Any],
    *,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    version: int = FORMAT_VERSION,
) -> RawChunk:
    """Encode samples into uncompressed records (see `RawChunk`), for a chunk of format
    ``version`` (1: whole records, which releases before the text parts read).

    Raises:
        UnencodableError: a sample holds a value that cannot be stored losslessly and safely.
    """
    if inline_limit < 0:
        raise ValueError("inline_limit must be >= 0")
    if version not in CHUNK_VERSIONS:
        raise ValueError(f"cannot write chunk format version {version}")
    texts = TEXT_FIELDS if version >= 2 else ()
    raw = RawChunk([], {})
    hand_over = GilHandOver()
    with gc_paused():
        for sample in samples:
            raw.add(encode_sample(sample, inline_limit=inline_limit, texts=texts))
            hand_over()
    return raw


class GilHandOver:
    """Call between samples while encoding: lets go of the GIL about every millisecond.

    NOTE: a writer packs and stores earlier chunks on other threads whose every syscall and
    zstd call releases the GIL and then waits for it: behind a thread that never lets go, each
    wait lasts the 5 ms switch interval.  Measured: 16 blob writes took 0.74 s beside a busy
    encoder, 0.05 s with this yield.  Not after every sample: each hand-over costs its wait.
    With the C extension it is `_native.hand_over`, which yields the core only until another
    thread has taken the GIL (at most `_HAND_OVER_SPIN_NS`); without it, ``time.sleep(0)``,
    a nap on the kernel's timer (~90 us on this project's VM) whether or not a thread waits
    (docs/architecture/save-protocol.md, "Handing the GIL over").
    """

    __slots__ = ("handed",)

    def __init__(self) -> None:
        self.handed = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self.handed > _HAND_OVER_EVERY:
            if native_hand_over is not None:
                native_hand_over(_HAND_OVER_SPIN_NS)
            else:
                time.sleep(0)
            self.handed = time.perf_counter()


def encode_chunk(
    samples: Sequence[Any],
    *,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    version: int = FORMAT_VERSION,
) -> EncodedChunk:
    """Encode up to a chunk's worth of samples into one chunk blob of format ``version``.

    Raises:
        UnencodableError: a sample holds a value that cannot be stored losslessly and safely.
    """
    return build_chunk(samples, inline_limit=inline_limit, version=version).pack(version=version)


class ChunkReader:
    """Random access to the samples of one chunk blob (format version 1 or 2).

    Only the index is parsed up front; `sample` decompresses and decodes one record, `fields`
    of the text fields only its text part.

    ``loader`` gives the tensor of a tensor blob (`TensorRef` calls it on a tensor's first
    use), ``array_loader`` the numpy array of an array stored as a blob (called as its
    sample is decoded).  Without a loader a tensor's `TensorRef` cannot materialize, and an
    array blob's record cannot be decoded (`InvalidInputError`).
    """

    def __init__(
        self,
        data: Buffer,
        *,
        digest: str = "?",
        loader: Callable[[str], torch.Tensor] | None = None,
        array_loader: Callable[[str], np.ndarray] | None = None,
    ) -> None:
        self.digest = digest
        self.loader = loader
        self.array_loader = array_loader
        # NOTE: read-only whatever ``data`` is: a writable part is one this reader inflated
        # into a buffer of its own (`_inflate_part`), never the caller's bytes.
        self._mv = memoryview(data).cast("B").toreadonly()
        try:
            magic, version, _flags, count = _HEAD.unpack_from(self._mv, 0)
        except struct.error as exc:
            raise IntegrityError(f"chunk blob {digest} is truncated (no header)") from exc
        _check_magic(magic, CHUNK_MAGIC, version, f"chunk blob {digest}", CHUNK_VERSIONS)
        self.version: int = version
        self._index = _INDEX if version == 1 else _INDEX2
        if _HEAD.size + count * self._index.size > self._mv.nbytes:
            raise IntegrityError(f"chunk blob {digest} is truncated (index of {count} records)")
        self._count = count
        # The blob's size: bounds every record (a reader of some records only, `read_records`,
        # holds fewer bytes than the blob has).
        self._size = self._mv.nbytes
        # (record, part) -> inflated bytes; part "t" is a text part, "r" the rest (version
        # 2) or the whole record (version 1); writable where the bytes are a buffer of their
        # own (`_inflate_into`)
        self._inflated: dict[tuple[int, str], memoryview] = {}

    def __len__(self) -> int:
        count: int = self._count
        return count

    def check_untruncated(self, where: str) -> None:
        """IntegrityError (``where``: archive and chunk) if the bytes read are a map of a
        file that has since shrunk (truncated in place, from outside): a read of the map past
        the file's end would now kill the process (SIGBUS).  A caller that let other code run
        since the read (a stream's read-ahead) asks before it reads on
        (docs/architecture/reading.md, "Reading")."""
        if map_truncated(self._mv.obj, self._size):
            raise IntegrityError(f"{where}: blob {self.digest} was truncated while it was read")

    def inflate(
        self, offsets: Iterable[int], *, texts_only: bool = False, texts: bool = True
    ) -> None:
        """Decompress these records (only their text parts with ``texts_only``, all but
        them without ``texts``) ahead of `sample` or `fields`, which then only decode them.

        One zstd call for all of them releases the GIL once, so a reader thread can inflate
        the next chunk while the caller decodes this one (one call per record made that
        thread wait for the GIL after every record).  A record that fails its checks here is
        left for `sample`, which raises its error with the record named.
        """
        todo: list[tuple[int, str]] = []
        frames: list[memoryview] = []
        sizes: list[int] = []
        # NOTE: records are checked one by one against the ratio bound, but a forged index
        # can point many of them at one frame; the whole batch keeps the same bound as a
        # single record, and what is past it is left for `sample` to inflate one at a time.
        budget = self._size * _MAX_RATIO + _RATIO_SLACK
        for i in sorted(set(offsets)):
            if not 0 <= i < self._count:
                continue
            try:
                parts = self._parts(i)
            except (ArchiveError, struct.error, ValueError):
                continue
            for part, body, raw_len, method in parts:
                if texts_only and part != "t" and self.version > 1:
                    continue
                if not texts and part == "t":
                    continue
                if method != _ZSTD or (i, part) in self._inflated:
                    continue
                try:
                    _check_frame(body, raw_len)
                except (ArchiveError, zstandard.ZstdError, ValueError):
                    continue
                budget -= raw_len
                if budget < 0:
                    break
                todo.append((i, part))
                frames.append(body)
                sizes.append(raw_len)
            if budget < 0:
                break
        large = [j for j, raw_len in enumerate(sizes) if raw_len >= _OWN_MIN]
        if large:
            owned = _inflate_many([(frames[j], sizes[j]) for j in large])
            for j, buffer in zip(large, owned, strict=True):
                if buffer is not None:
                    self._inflated[todo[j]] = buffer
            small = [j for j, raw_len in enumerate(sizes) if raw_len < _OWN_MIN]
            todo, frames, sizes = (
                [todo[j] for j in small],
                [frames[j] for j in small],
                [sizes[j] for j in small],
            )
        if not todo:
            return
        try:
            out: Any = _decompressor().multi_decompress_to_buffer(
                frames,  # type: ignore[arg-type]  # a list of buffers, as documented
                decompressed_sizes=struct.pack(f"<{len(sizes)}Q", *sizes),
            )
        except (zstandard.ZstdError, ValueError, TypeError, MemoryError):
            return  # each `sample` inflates its own record and names the one that fails
        for key, raw_len, segment in zip(todo, sizes, out, strict=True):
            view = memoryview(segment)
            if view.nbytes == raw_len:
                self._inflated[key] = view.toreadonly()

    def raw_size(self, i: int) -> int:
        """The bytes record ``i`` inflates to, as its index says (0 for a record whose index
        entry is damaged: reading it raises its error)."""
        try:
            return sum(raw_len for _, _, raw_len, _ in self._parts(i))
        except (ArchiveError, struct.error, ValueError):
            return 0

    def _parts(self, i: int) -> list[tuple[str, memoryview, int, int]]:
        """Record ``i``'s stored parts: ``(part, stored bytes, raw length, method)``; a text
        part only where there is one."""
        at = _HEAD.size + i * self._index.size
        if self.version == 1:
            offset, stored, raw_len, method = _INDEX.unpack_from(self._mv, at)
            return [("r", self._slice(offset, stored), raw_len, method)]
        offset, t_stored, t_raw, r_stored, r_raw, t_method, r_method, _ = _INDEX2.unpack_from(
            self._mv, at
        )
        whole = self._slice(offset, t_stored + r_stored)
        rest = ("r", whole[t_stored:], r_raw, r_method)
        if t_stored == 0 and t_raw == 0:
            return [rest]
        return [("t", whole[:t_stored], t_raw, t_method), rest]

    def _slice(self, offset: int, stored: int) -> memoryview:
        if offset + stored > self._mv.nbytes or offset < _HEAD.size:
            raise IntegrityError("record runs past the end of the chunk")
        return self._mv[offset : offset + stored]

    def _verify(self, i: int) -> None:
        """Check record ``i``'s stored bytes against its xxh3-64 (version 2)."""
        if self.version == 1:
            return
        offset, t_stored, _, r_stored, _, _, _, checksum = _INDEX2.unpack_from(
            self._mv, _HEAD.size + i * _INDEX2.size
        )
        if xxhash.xxh3_64_intdigest(self._slice(offset, t_stored + r_stored)) != checksum:
            raise IntegrityError("record does not match its checksum")

    def _inflate_part(
        self, i: int, part: str, body: memoryview, raw_len: int, method: int
    ) -> memoryview:
        """Part ``part`` of record ``i`` inflated: writable where it is a buffer of its own
        (`_inflate_into`), which the decoder may hand on (``in_place``), else read-only."""
        ahead = self._inflated.pop((i, part), None)
        if ahead is not None:
            return ahead
        if method == _RAW:
            if raw_len != body.nbytes:
                raise IntegrityError("raw record length mismatch")
            return body
        if method != _ZSTD:
            raise UnsupportedFormatError(f"unknown record compression {method}")
        if raw_len >= _OWN_MIN:
            return _inflate_into(body, raw_len)
        return memoryview(_inflate(body, raw_len))

    def _record(self, i: int, *, text: bool = True, rest: bool = True) -> dict[str, memoryview]:
        """Record ``i``'s inflated parts, of those asked for: ``"t"`` (its text part, if it
        has one) and ``"r"`` (the rest, or the whole record of a version 1 chunk)."""
        return {
            part: self._inflate_part(i, part, body, raw_len, method)
            for part, body, raw_len, method in self._parts(i)
            if (text if part == "t" else rest)
        }

    def sample(
        self, i: int, *, as_arrays: bool = False, dtypes: Mapping[str, np.dtype] | None = None
    ) -> Any:
        """Decode the sample at offset ``i`` of this chunk.

        With ``as_arrays``, every field that is a list of ints (within int64) or of floats
        comes back as ``np.array(that list)``: same values, int64 or float64, writable; or,
        for a field ``dtypes`` names, as an array of that dtype (`codec.dtypes.numbers_as`).

        Raises:
            NotHeldError: a value of a field ``dtypes`` names does not fit its dtype.
        """

        def decode() -> Any:
            self._verify(i)
            parts = self._record(i)
            return decode_sample(
                parts["r"],
                self.loader,
                as_arrays=as_arrays,
                text=parts.get("t"),
                dtypes=dtypes,
                in_place=True,
                array_loader=self.array_loader,
            )

        return self._decode(i, decode)

    def record(
        self, i: int, names: Collection[str] | None = None
    ) -> tuple[str | None, dict[str, Any], list[str] | None]:
        """The record at offset ``i`` as ``(class name, fields, converted)``, numeric list
        fields as `StoredNumbers` (see `decode_record`); errors as `sample`.  With ``names``,
        only those top-level fields (the record's text part is not inflated unless one of
        them is a text field)."""

        def decode() -> Any:
            self._verify(i)
            texts = names is None or any(n in TEXT_FIELDS for n in names)
            parts = self._record(i, text=texts)
            return decode_record(
                parts["r"],
                self.loader,
                stored=True,
                text=parts.get("t"),
                names=names,
                in_place=True,
                array_loader=self.array_loader,
            )

        return self._decode(i, decode)  # type: ignore[no-any-return]

    def record_class(self, i: int) -> str | None:
        """The class name the record at offset ``i`` names (None for a dict), read from its
        tree alone: no field is decoded, no class rebuilt."""

        def decode() -> Any:
            self._verify(i)
            return record_class_name(self._record(i)["r"])

        return self._decode(i, decode)  # type: ignore[no-any-return]

    def fields(
        self, i: int, names: Collection[str], *, require: Needle | None = None
    ) -> dict[str, Any] | None:
        """Only the top-level fields ``names`` of the sample at offset ``i`` (a search reads
        its texts so, without decoding token ids or log-probs); missing ones are left out.
        Of a version 2 chunk, text fields (`TEXT_FIELDS`) come from the record's text part
        alone: the rest is neither inflated nor checked against the record's checksum (a
        search reads whole chunks, verified by their digest).

        With ``require``, None unless the inflated bytes read hold a match of it: nothing
        is decoded for a record that cannot hold what a search looks for.
        """
        others = [n for n in names if n not in TEXT_FIELDS]

        def decode() -> dict[str, Any] | None:
            parts = self._record(i, rest=False)
            text = parts.get("t")
            if text is None:
                whole = self._record(i, text=False)["r"]
                if require is not None and require.search(whole) is None:
                    return None
                return decode_fields(whole, names, self.array_loader)
            rest = self._record(i, text=False)["r"] if others else None
            if (
                require is not None
                and require.search(text) is None
                and (rest is None or require.search(rest) is None)
            ):
                return None
            found = decode_fields(text, [n for n in names if n in TEXT_FIELDS], self.array_loader)
            if rest is not None:
                found.update(decode_fields(rest, others, self.array_loader))
            return _ordered(found, names)  # in the order asked, as v1

        return self._decode(i, decode)  # type: ignore[no-any-return]

    def search_texts(
        self, offsets: Sequence[int], names: Collection[str], require: Needle | None = None
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(k, fields)`` for each ``offsets[k]`` whose record holds ``require`` (every one
        without it), in order: what `fields` gives of the text fields ``names`` (a part of
        `TEXT_FIELDS`), of a whole chunk at once (a search's path).

        Of a version 2 chunk the text parts of all records are inflated in one zstd call,
        their index read as one array, and searched for a `BytesNeedle` in one C call, both
        releasing the GIL: no Python object is made for a record without the needle.  A
        record this batch does not take (a raw or missing text part, a version 1 chunk,
        anything odd in its entry) goes through `fields`, which names it if it is damaged.
        As `fields`, neither the records' checksums nor the rests are read: a search reads
        whole chunks, checked against their digest.
        """
        names = list(names)
        if any(n not in TEXT_FIELDS for n in names):
            raise ValueError(f"search_texts reads only {TEXT_FIELDS}")
        batch = self._text_batch(offsets, require) if self.version > 1 else {}
        for k, i in enumerate(offsets):
            if i not in batch:
                values = self.fields(i, names, require=require)
            else:
                text = batch[i]
                if text is None:
                    continue
                values = self._decode(i, partial(_decoded_texts, text, names, self.array_loader))
            if values is not None:
                yield k, values

    def _text_batch(
        self, offsets: Sequence[int], require: Needle | None
    ) -> dict[int, memoryview | None]:
        """Offset -> its record's inflated text part, or None when it lacks ``require``, for
        the records of ``offsets`` whose text part is one plausible zstd frame or stored raw
        (see `search_texts`); the others are left out."""
        n = self._count
        want = np.fromiter(
            (i for i in dict.fromkeys(offsets) if type(i) is int and 0 <= i < n), np.int64
        )
        if not want.size:
            return {}
        index = np.frombuffer(self._mv, _INDEX2_ARRAY, n, _HEAD.size)[want]
        size = self._mv.nbytes
        offset, t_stored, r_stored = index["offset"], index["t_stored"], index["r_stored"]
        t_raw, method = index["t_raw"], index["t_method"]
        # NOTE: each length is bounded by the blob before they are added, so no sum wraps;
        # the ratio bound is the one `_check_frame` applies (uint64 products of lengths past
        # the blob may wrap, but those entries are already refused by the first terms).
        with np.errstate(over="ignore"):
            placed = (
                (t_stored > 0)
                & (offset >= _HEAD.size + n * _INDEX2.size)
                & (offset <= size)
                & (t_stored <= size)
                & (r_stored <= size)
                & (offset + t_stored + r_stored <= size)
            )
            packed = (
                placed
                & (method == _ZSTD)
                & (t_raw > 0)
                & (t_raw <= t_stored * np.uint64(_MAX_RATIO) + np.uint64(_RATIO_SLACK))
            )
        plain = placed & (method == _RAW) & (t_raw == t_stored)
        keys: list[int] = []
        parts: list[Any] = []
        sizes = t_raw[packed]
        # The whole batch keeps the bound of one record (see `inflate`); the records past it
        # are left to `fields`, one at a time.
        budget = self._mv.nbytes * _MAX_RATIO + _RATIO_SLACK
        within = 0
        for raw_len in sizes.tolist():
            budget -= raw_len
            if budget < 0:
                break
            within += 1
        if within:
            segments = np.empty((within, 2), "<u8")
            segments[:, 0] = offset[packed][:within]
            segments[:, 1] = t_stored[packed][:within]
            try:
                # zstandard checks that each frame inflates to exactly its stated size, and
                # allocates no more than those sizes (a frame's own content size is not
                # trusted).
                texts: Any = _decompressor().multi_decompress_to_buffer(
                    zstandard.BufferWithSegments(self._mv, segments.tobytes()),
                    decompressed_sizes=sizes[:within].astype("<u8").tobytes(),
                )
            except (zstandard.ZstdError, ValueError, TypeError, MemoryError):
                pass  # each record then goes through `fields`, which names the one that fails
            else:
                keys += want[packed][:within].tolist()
                parts += list(texts)
        if plain.any():  # raw text parts (zstd did not pay): searched where they are
            keys += want[plain].tolist()
            parts += [
                self._mv[at : at + length]
                for at, length in zip(offset[plain].tolist(), t_stored[plain].tolist(), strict=True)
            ]
        if isinstance(require, BytesNeedle):
            hits = require.holding(parts)
        elif require is not None:
            hits = [
                j for j, part in enumerate(parts) if require.search(memoryview(part)) is not None
            ]
        else:
            hits = list(range(len(parts)))
        out: dict[int, memoryview | None] = dict.fromkeys(keys)
        for j in hits:
            out[keys[j]] = memoryview(parts[j])
        return out

    def _decode(self, i: int, decode: Callable[[], Any]) -> Any:
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {self.digest} has {self._count} samples, not {i + 1}")
        what = f"chunk blob {self.digest}, record {i}"
        try:
            return decode()
        except InvalidInputError as exc:  # the caller's dtype or loaders, not damage
            raise type(exc)(f"{what}: {exc}") from None
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


def _ordered(found: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
    return {n: found[n] for n in names if n in found}


def _decoded_texts(
    text: memoryview, names: list[str], array_loader: Callable[[str], np.ndarray] | None
) -> dict[str, Any]:
    return _ordered(decode_fields(text, names, array_loader), names)


class _SomeRecords(ChunkReader):
    """A `ChunkReader` holding a version 2 chunk's header and index and only the records
    `read_records` fetched; asking for any other record is an `IntegrityError`."""

    def __init__(
        self,
        head: bytes,
        size: int,
        *,
        digest: str,
        loader: Callable[[str], torch.Tensor] | None,
        array_loader: Callable[[str], np.ndarray] | None,
    ) -> None:
        super().__init__(head, digest=digest, loader=loader, array_loader=array_loader)
        self._size = size
        self._records: dict[int, memoryview] = {}

    def _slice(self, offset: int, stored: int) -> memoryview:
        if offset + stored > self._size or offset < self._mv.nbytes:
            raise IntegrityError("record runs past the end of the chunk")
        held = self._records.get(offset)
        if held is None or held.nbytes < stored:
            raise IntegrityError("record was not read")
        return held[:stored]


def read_records(
    read_range: Callable[[int, int], bytes],
    offsets: Iterable[int],
    *,
    digest: str,
    size: int,
    count: int,
    loader: Callable[[str], torch.Tensor] | None = None,
    array_loader: Callable[[str], np.ndarray] | None = None,
) -> ChunkReader | None:
    """A reader of records ``offsets`` of a version 2 chunk blob, fetched by ranged reads
    (``read_range(offset, length)``, unverified bytes): the header and index, then each
    record, which `ChunkReader.sample` checks against its xxh3-64 before decoding it.

    ``size`` and ``count`` are the blob's size and record count as the catalog knows them:
    the header must hold ``count`` records, each index entry asked for must point past the
    index and within ``size`` bytes, and each record must come back whole.  None when the
    chunk is not version 2 (version 1 has no record checksums): read it whole, verified.
    A record's neighbours are never read, so damage elsewhere in the blob goes unnoticed
    here (the whole-blob checks, `verify`, find it).

    Raises:
        IntegrityError: names the chunk (and the record) whose bytes fail those checks.
    """
    what = f"chunk blob {digest}"
    index_end = _HEAD.size + count * _INDEX2.size
    if count < 0 or index_end > size:
        raise IntegrityError(f"{what}: the catalog's {count} records do not fit its {size} bytes")
    head = read_range(0, index_end)
    if len(head) < _HEAD.size:
        raise IntegrityError(f"{what} is truncated (no header)")
    magic, version, _flags, n = _HEAD.unpack_from(head, 0)
    if magic != CHUNK_MAGIC:
        raise IntegrityError(f"{what} is not a chunk blob (bad magic)")
    if version != 2:
        return None
    if n != count:
        raise IntegrityError(f"{what}: its header holds {n} records, the catalog {count}")
    if len(head) < index_end:
        raise IntegrityError(f"{what} is truncated (index of {count} records)")
    reader = _SomeRecords(head, size, digest=digest, loader=loader, array_loader=array_loader)
    for i in sorted(set(offsets)):
        if not 0 <= i < n:
            continue  # `sample` raises IndexError for it, as for a whole chunk
        offset, t_stored, _, r_stored, _, _, _, _ = _INDEX2.unpack_from(
            head, _HEAD.size + i * _INDEX2.size
        )
        stored = t_stored + r_stored
        if offset < index_end or offset + stored > size:
            raise IntegrityError(f"{what}, record {i}: its index entry points outside the chunk")
        if offset in reader._records and reader._records[offset].nbytes >= stored:
            continue
        data = read_range(offset, stored)
        if len(data) < stored:
            raise IntegrityError(f"{what}, record {i} is truncated")
        reader._records[offset] = memoryview(data)
    return reader


def decode_chunk(
    data: Buffer,
    *,
    digest: str = "?",
    loader: Callable[[str], torch.Tensor] | None = None,
    array_loader: Callable[[str], np.ndarray] | None = None,
) -> list[Any]:
    """Every sample of a chunk blob, in order (``loader`` and ``array_loader`` as
    `ChunkReader`'s)."""
    with gc_paused():
        return list(ChunkReader(data, digest=digest, loader=loader, array_loader=array_loader))
