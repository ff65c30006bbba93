"""One-key loads by ranged reads (docs/architecture/reading.md, "Reading"): a few records of a
version 2 chunk are read as the header and index, then each record, checked against its xxh3-64; a
damaged record, a damaged index entry or a truncated blob raise `IntegrityError` naming chunk
and record while a neighbour still loads; the samples are those of the whole-chunk path;
version 1 chunks keep the whole verified read.

The checks are functions of a pool and a way to rewrite a blob behind its back, so that
`tests/blobs/test_s3.py` runs them on a pool on S3 too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ranged import (
    CHUNK,
    Reads,
    check_damaged_index_entry,
    check_damaged_record,
    check_same_samples,
    check_truncated,
    check_version_1_reads_whole,
    force_ranged,
    samples,
)
from helpers import local_store

from archive_manager import ArchiveManager
from archive_manager.errors import IntegrityError
from archive_manager.pool import archive as archive_mod


@pytest.fixture
def local_pool(tmp_path: Path) -> Iterator[ArchiveManager]:
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        yield pool


def rewrite_file(pool: ArchiveManager, digest: str, data: bytes) -> None:
    path = local_store(pool).path(digest)
    os.chmod(path, 0o644)
    path.write_bytes(data)


def test_same_samples_as_the_whole_chunk(
    local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_same_samples(local_pool, monkeypatch)


def test_damaged_record(local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    check_damaged_record(local_pool, rewrite_file, monkeypatch)


def test_damaged_index_entry(local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    check_damaged_index_entry(local_pool, rewrite_file, monkeypatch)


def test_truncated_blob(local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch) -> None:
    check_truncated(local_pool, rewrite_file, monkeypatch)


def test_version_1_chunks_are_read_whole(
    local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_version_1_reads_whole(local_pool, monkeypatch)


def test_small_chunks_and_many_records_are_read_whole(
    local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    arc = local_pool.save("small", samples(), rollout_id=1)
    assert max(c["size"] for c in arc.chunks()) < archive_mod._RANGED_MIN_SIZE
    reads = Reads(local_pool)
    try:
        arc.load_sample(3)
        assert (reads.whole, reads.ranged) == (1, 0)
        monkeypatch.setattr(archive_mod, "_RANGED_MIN_SIZE", 0)
        arc.load_sample(3)
        assert (reads.whole, reads.ranged) == (1, 2)
        arc.load_samples()  # eight records of each chunk wanted
        assert (reads.whole, reads.ranged) == (4, 2)
    finally:
        reads.close()


def test_a_missing_chunk_on_the_ranged_path(
    local_pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    arc = local_pool.save("gone", samples(), rollout_id=1)
    force_ranged(monkeypatch)
    digest = arc.chunks()[2]["digest"]
    path = local_pool.store.path(digest)  # type: ignore[attr-defined]
    path.unlink()
    with pytest.raises(IntegrityError, match=rf"'gone', chunk 2: blob {digest} is missing"):
        arc.load_sample(2 * CHUNK)
