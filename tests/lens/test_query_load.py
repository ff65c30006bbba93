"""Loading what a query found: `pool.load(rows)` and `pool.query(...).load()` return the samples
of the rows, in the rows' order, across archives, reading each chunk once; rows whose archive
is gone or reclaimed are refused with a clear error before any blob is read."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Backend, canon, open_on, tiny_rollout

from archive_manager import ArchiveManager
from archive_manager.blobs import BlobStore
from archive_manager.errors import ArchiveNotFoundError, ArchiveReleasedError, InvalidInputError
from archive_manager.lens.query import SampleRow
from archive_manager.testing.faults import FaultyBlobStore

CHUNK = 4


class CountingStore(FaultyBlobStore):
    """The folder store, counting the reads of each blob (whole and ranged)."""

    def __init__(self, root: Path) -> None:
        super().__init__(BlobStore(root))
        self.reads: Counter[str] = Counter()

    def get(self, digest: str) -> bytes:
        self.reads[digest] += 1
        return super().get(digest)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        self.reads[digest] += 1
        return super().read_range(digest, offset, length)


@pytest.fixture
def counted(tmp_path: Path, backend: Backend) -> Iterator[tuple[ArchiveManager, CountingStore]]:
    root = tmp_path / "pool"
    root.mkdir()
    store = CountingStore(root)
    with open_on(backend, root, chunk_size=CHUNK, store=store) as pool:
        for rid in range(3):
            pool.save(f"r{rid}", tiny_rollout(10, seed=rid, rollout_id=rid), rollout_id=rid)
        store.reads.clear()
        yield pool, store


def one_by_one(pool: ArchiveManager, rows: list[SampleRow]) -> list[Any]:
    return [pool.open_archive(r.archive).load_sample(r.position) for r in rows]


def chunk_of(pool: ArchiveManager) -> dict[tuple[str, int], str]:
    """(archive, position) -> its chunk's digest."""
    where = {}
    for name in ("r0", "r1", "r2"):
        chunks = pool.open_archive(name).chunks()
        for position in range(10):
            where[name, position] = chunks[position // CHUNK]["digest"]
    return where


def test_rows_of_several_archives_load_in_their_order(
    counted: tuple[ArchiveManager, CountingStore],
) -> None:
    pool, _ = counted
    rows = pool.query(status="completed")
    assert {r.archive for r in rows} == {"r0", "r1", "r2"}
    expected = one_by_one(pool, rows)
    assert [canon(s) for s in pool.load(rows)] == [canon(s) for s in expected]
    # Any order, several archives interleaved: the samples follow the rows.
    shuffled = list(rows)
    random.Random(3).shuffle(shuffled)
    loaded = pool.load(shuffled)
    assert [canon(s) for s in loaded] == [canon(s) for s in one_by_one(pool, shuffled)]
    assert [s.index for s in loaded] == [
        pool.open_archive(r.archive).load_sample(r.position).index for r in shuffled
    ]


def test_each_chunk_is_read_once(counted: tuple[ArchiveManager, CountingStore]) -> None:
    pool, store = counted
    rows = pool.query()  # every sample of the three archives: 3 chunks each
    picked = [rows[i] for i in (25, 0, 13, 1, 27, 2, 14, 12, 26, 3)]
    where = chunk_of(pool)
    pool.load(reversed(picked))  # any iterable of rows
    needed = {where[r.archive, r.position] for r in picked}
    assert set(store.reads) == needed
    assert all(n == 1 for n in store.reads.values()), store.reads


def test_the_result_equals_load_samples_of_the_same_samples(
    counted: tuple[ArchiveManager, CountingStore],
) -> None:
    pool, _ = counted
    arc = pool.open_archive("r1")
    task_key = arc.keys()[4][1]
    assert task_key is not None
    rows = pool.query(task_key=task_key)
    assert [r.archive for r in rows] == ["r1", "r1"]
    assert [canon(s) for s in rows.load()] == [
        canon(s) for s in arc.load_samples(task_key=task_key)
    ]
    every = pool.query(rollout_ids=(0, 1))
    assert [canon(s) for s in pool.load(every)] == [
        canon(s) for s in pool.open_archive("r0").load_samples() + arc.load_samples()
    ]
    # as_arrays and materialize as load_samples has them.
    arrays = pool.load(every[:3], as_arrays=True, materialize=True)
    assert isinstance(arrays[0].tokens, np.ndarray)
    direct = pool.open_archive("r0").load_samples(as_arrays=True)[:3]
    assert [s.tokens.tolist() for s in arrays] == [s.tokens.tolist() for s in direct]


def test_query_result_load_and_repeats(counted: tuple[ArchiveManager, CountingStore]) -> None:
    pool, store = counted
    rows = pool.query(min_rollout_id=2)
    assert [canon(s) for s in rows.load()] == [canon(s) for s in pool.load(rows)]
    store.reads.clear()
    twice = pool.load([rows[5], rows[5], rows[0]])
    assert twice[0] is twice[1]
    assert [canon(s) for s in twice] == [
        canon(s) for s in one_by_one(pool, [rows[5], rows[5], rows[0]])
    ]
    assert pool.load([]) == [] and pool.query(task_key="none").load() == []


def test_rows_of_reclaimed_archives_are_refused_before_any_read(
    counted: tuple[ArchiveManager, CountingStore],
) -> None:
    pool, store = counted
    rows = pool.query(state=None)
    pool.open_archive("r1").release()
    # Released, not yet collected: its payload is still there, and loads.
    assert len(pool.load(rows)) == 30
    pool.gc(grace=0)
    store.reads.clear()
    with pytest.raises(ArchiveReleasedError, match=r"'r1' was released .*\(10 of the rows"):
        pool.load(rows)
    assert not store.reads
    # The rows of the other archives still load.
    assert len(pool.load([r for r in rows if r.archive != "r1"])) == 20


def test_rows_that_do_not_match_the_pool_are_refused(
    counted: tuple[ArchiveManager, CountingStore],
) -> None:
    pool, store = counted
    row = pool.query(limit=1)[0]
    by_hand = dataclasses.replace(row, archive_id=None)
    assert canon(pool.load([by_hand])) == canon(pool.load([row]))
    store.reads.clear()
    with pytest.raises(ArchiveNotFoundError, match="'gone'"):
        pool.load([dataclasses.replace(row, archive="gone", archive_id=None)])
    with pytest.raises(InvalidInputError, match="holds no sample 'other' at position 0"):
        pool.load([dataclasses.replace(row, sample_key="other")])
    for bad in ("r0", row, [("r0", 0)], 5, [dataclasses.replace(row, position=-1)]):
        with pytest.raises(InvalidInputError):
            pool.load(bad)  # type: ignore[arg-type]
    assert not store.reads


def test_rows_of_another_pool_are_refused(
    counted: tuple[ArchiveManager, CountingStore], tmp_path: Path, backend: Backend
) -> None:
    """Another pool's catalog gives the same ids to its own archives: its rows are refused,
    not answered with this pool's samples of that id."""
    pool, store = counted
    with open_on(backend, tmp_path / "other", chunk_size=CHUNK) as other:
        other.save("elsewhere", tiny_rollout(10, seed=9), rollout_id=0)
        rows = other.query(rollout_ids=0)
        assert {r.archive_id for r in rows} <= {r.archive_id for r in pool.query(rollout_ids=0)}
        store.reads.clear()
        with pytest.raises(InvalidInputError, match="another pool"):
            pool.load(rows)
        assert not store.reads


def test_rows_from_before_a_catalog_rebuild_load_their_own_archive(tmp_path: Path) -> None:
    """A rebuilt catalog numbers the archives anew: a row still reads the archive of its name
    and manifest, and is refused once that name holds another archive."""
    root = tmp_path / "pool"
    with ArchiveManager.open(root, chunk_size=CHUNK) as pool:
        for name in ("zeta", "alpha", "mid"):
            pool.save(name, [{"index": i, "prompt": f"{name} {i}"} for i in range(3)], rollout_id=1)
        rows = pool.query(rollout_ids=1)
        expected = [s["prompt"] for s in pool.load(rows)]
    assert [p.split()[0] for p in expected] == [r.archive for r in rows]
    for path in root.glob("catalog.db*"):
        path.unlink()
    with ArchiveManager.open(root, recover=True, chunk_size=CHUNK) as pool:
        pool.rebuild_catalog()
        ids = {i.name: i.id for i in pool.find()}
        assert any(ids[r.archive] != r.archive_id for r in rows)  # renumbered
        assert [s["prompt"] for s in pool.load(rows)] == expected
        pool.release(["alpha"])
        pool.save(
            "alpha",
            [{"index": i, "prompt": f"new {i}"} for i in range(3)],
            rollout_id=1,
            supersede=True,
        )
        with pytest.raises(InvalidInputError, match="'alpha' is not the archive 3 of the rows"):
            pool.load(rows)
        assert [s["prompt"] for s in pool.load([r for r in rows if r.archive != "alpha"])] == [
            p for p in expected if not p.startswith("alpha")
        ]


def test_rows_of_a_superseded_archive_load_it_until_gc_reclaims_it(
    counted: tuple[ArchiveManager, CountingStore],
) -> None:
    """The rows are of the archive the query found: once its name was saved again, they
    loaded nothing ("not in the pool (it is superseded)", although `history` lists it)."""
    pool, store = counted
    rows = pool.query(rollout_ids=1)
    expected = [canon(s) for s in pool.load(rows)]
    pool.open_archive("r1").release()
    pool.save("r1", tiny_rollout(10, seed=7, rollout_id=1), rollout_id=1, supersede=True)
    assert [canon(s) for s in pool.load(rows)] == expected
    assert [canon(s) for s in pool.query(rollout_ids=1).load()] != expected  # the new one
    pool.gc(grace=0)
    store.reads.clear()
    with pytest.raises(ArchiveReleasedError, match=r"'r1' \(id \d+\) of 10 .* was superseded"):
        pool.load(rows)
    assert not store.reads
