"""The ranged read's checks, shared by the folder store's tests (tests/pool/test_ranged_load.py)
and the S3 store's (tests/blobs/test_s3.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest

from archive_manager import ArchiveManager, codec
from archive_manager.errors import IntegrityError
from archive_manager.interop.synthetic import make_rollout
from archive_manager.pool import archive as archive_mod
from archive_manager.testing.blob_store import flip_bit

_HEAD = struct.Struct("<8sHHI")  # magic, version, flags, n
_ENTRY = struct.Struct("<QQQQQBB6xQ")  # offset, t stored, t raw, r stored, r raw, ..., xxh3
CHUNK = 8

Rewrite = Callable[[ArchiveManager, str, bytes], None]


def samples(n: int = 24) -> list[Any]:
    return make_rollout(n, response_min=32, response_max=96, seed=11)


def force_ranged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every load of a few records takes the ranged path, whatever the chunk's size."""
    monkeypatch.setattr(archive_mod, "_RANGED_MIN_SIZE", 0)
    monkeypatch.setattr(archive_mod, "_RANGED_MIN_SIZE_REMOTE", 0)


class Reads:
    """Counts the store's whole reads and ranged reads (wraps the instance's methods)."""

    def __init__(self, pool: ArchiveManager) -> None:
        self.whole = 0
        self.ranged = 0
        store = pool.store
        get, get_view, read_range = store.get, store.get_view, store.read_range

        inside_view = False  # a store's get_view may read through its get: one read

        def counted_get(digest: str) -> bytes:
            self.whole += 0 if inside_view else 1
            return get(digest)

        def counted_view(digest: str) -> memoryview:
            nonlocal inside_view
            self.whole += 1
            inside_view = True
            try:
                return get_view(digest)
            finally:
                inside_view = False

        def counted_range(digest: str, offset: int, length: int) -> bytes:
            self.ranged += 1
            return read_range(digest, offset, length)

        store.get = counted_get  # type: ignore[method-assign]
        store.get_view = counted_view  # type: ignore[method-assign]
        store.read_range = counted_range  # type: ignore[method-assign]

        def undo() -> None:
            del store.get, store.get_view, store.read_range  # the class's methods again

        self._undo = undo

    def close(self) -> None:
        self._undo()


def entry(data: bytes, i: int) -> tuple[int, int, int]:
    """Record ``i``'s offset, stored length and where its index entry starts."""
    at = _HEAD.size + i * _ENTRY.size
    offset, t_stored, _, r_stored, *_ = _ENTRY.unpack_from(data, at)
    return offset, t_stored + r_stored, at


def check_same_samples(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sample by ranged reads equals the one the whole-chunk path loads."""
    arc = pool.save("same", samples(), rollout_id=1)
    monkeypatch.setattr(archive_mod, "_RANGED_MAX_RECORDS", 0)
    reads = Reads(pool)
    try:
        whole = [arc.load_sample(p) for p in range(len(arc))]
        assert reads.whole == len(arc) and reads.ranged == 0
        keyed = arc.load_samples(sample_key=arc.keys()[5][0])
        monkeypatch.undo()
        force_ranged(monkeypatch)
        reads.whole = 0
        ranged = [arc.load_sample(p) for p in range(len(arc))]
        assert reads.whole == 0 and reads.ranged == 2 * len(arc)  # index, then the record
        assert [s.__dict__ for s in ranged] == [s.__dict__ for s in whole]
        assert [s.__dict__ for s in arc.load_samples(sample_key=arc.keys()[5][0])] == [
            s.__dict__ for s in keyed
        ]
        assert [s.__dict__ for s in arc.load_samples()] == [s.__dict__ for s in whole]
    finally:
        reads.close()


def _chunk(pool: ArchiveManager, name: str, ordinal: int = 1) -> tuple[str, bytes]:
    digest = pool.open_archive(name).chunks()[ordinal]["digest"]
    return digest, pool.store.get(digest)


def _neighbour_loads(pool: ArchiveManager, name: str, position: int, saved: list[Any]) -> None:
    assert pool.open_archive(name).load_sample(position).__dict__ == saved[position].__dict__


def check_damaged_record(
    pool: ArchiveManager, rewrite: Rewrite, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = samples()
    pool.save("rec", saved, rollout_id=1)
    force_ranged(monkeypatch)
    digest, data = _chunk(pool, "rec")
    offset, stored, _ = entry(data, 3)
    rewrite(pool, digest, flip_bit(data, offset + stored // 2))
    arc = pool.open_archive("rec")
    with pytest.raises(IntegrityError, match=rf"chunk 1\b.*{digest}.*record 3.*checksum"):
        arc.load_sample(CHUNK + 3)
    _neighbour_loads(pool, "rec", CHUNK + 4, saved)
    _neighbour_loads(pool, "rec", CHUNK + 2, saved)


def check_damaged_index_entry(
    pool: ArchiveManager, rewrite: Rewrite, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = samples()
    pool.save("idx", saved, rollout_id=1)
    force_ranged(monkeypatch)
    digest, data = _chunk(pool, "idx")
    _, _, at = entry(data, 2)
    # Entry 2's checksum damaged: record 2 fails its check, record 5 loads.
    rewrite(pool, digest, flip_bit(data, at + _ENTRY.size - 1))
    arc = pool.open_archive("idx")
    with pytest.raises(IntegrityError, match=rf"{digest}.*record 2.*checksum"):
        arc.load_sample(CHUNK + 2)
    _neighbour_loads(pool, "idx", CHUNK + 5, saved)
    # Entry 6's offset past the blob's end.
    far = bytearray(data)
    struct.pack_into("<Q", far, _HEAD.size + 6 * _ENTRY.size, len(data) + 10)
    rewrite(pool, digest, bytes(far))
    with pytest.raises(IntegrityError, match=rf"{digest}, record 6: its index entry points"):
        arc.load_sample(CHUNK + 6)
    # Entry 1's offset into the index: no record lives there.
    struct.pack_into("<Q", far, _HEAD.size + _ENTRY.size, _HEAD.size)
    rewrite(pool, digest, bytes(far))
    with pytest.raises(IntegrityError, match=rf"{digest}, record 1: its index entry points"):
        arc.load_sample(CHUNK + 1)
    _neighbour_loads(pool, "idx", CHUNK + 0, saved)
    # The header's record count changed: the catalog's count is the one believed.
    struct.pack_into("<I", far, 12, CHUNK + 1)
    rewrite(pool, digest, bytes(far))
    with pytest.raises(IntegrityError, match=rf"{digest}: its header holds 9 records"):
        arc.load_sample(CHUNK)
    rewrite(pool, digest, b"NOTCHUNK" + data[8:])
    with pytest.raises(IntegrityError, match=rf"{digest} is not a chunk blob"):
        arc.load_sample(CHUNK)


def check_truncated(
    pool: ArchiveManager, rewrite: Rewrite, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = samples()
    pool.save("cut", saved, rollout_id=1)
    force_ranged(monkeypatch)
    digest, data = _chunk(pool, "cut")
    last = CHUNK - 1
    offset, stored, _ = entry(data, last)
    rewrite(pool, digest, data[: offset + stored // 2])  # the last record cut in two
    arc = pool.open_archive("cut")
    with pytest.raises(IntegrityError, match=rf"chunk 1\b.*{digest}, record {last} is truncated"):
        arc.load_sample(CHUNK + last)
    # A record before the cut is whole and checked: it loads (verify finds the truncation).
    _neighbour_loads(pool, "cut", CHUNK + 1, saved)
    rewrite(pool, digest, data[: _HEAD.size + 3 * _ENTRY.size])  # cut in the index
    with pytest.raises(IntegrityError, match=rf"{digest} is truncated \(index of {CHUNK}"):
        arc.load_sample(CHUNK + 1)
    _neighbour_loads(pool, "cut", 0, saved)  # another chunk


def check_version_1_reads_whole(pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = samples()
    with monkeypatch.context() as m:
        real_pack = codec.RawChunk.pack
        m.setattr(codec.RawChunk, "pack", lambda self: real_pack(self, version=1))
        real_encode = codec.encode_sample
        m.setattr(codec, "encode_sample", lambda s, **kw: real_encode(s, texts=(), **kw))
        arc = pool.save("v1", saved, rollout_id=1)
    force_ranged(monkeypatch)
    reads = Reads(pool)
    try:
        assert arc.load_sample(CHUNK + 3).__dict__ == saved[CHUNK + 3].__dict__
        assert reads.whole == 1 and reads.ranged == 1  # the header said version 1
    finally:
        reads.close()


# --------------------------------------------------------------------------- local store
