"""Streaming reads and sequence access: `Archive.iter_samples` yields samples in order while
holding at most two chunks (counted: chunk readers alive and chunk blobs read, never timed),
and ``iter(arc)``, ``arc[i]`` and ``arc[a:b:c]`` behave as on a list."""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _sharing import run_python

import archive_manager.codec as codec_module
import archive_manager.pool.archive as archive_module
from archive_manager import ArchiveManager
from archive_manager.codec import ChunkReader
from archive_manager.errors import IntegrityError, InvalidInputError

CHUNK = 4
N = 30  # 8 chunks, the last one short


def _samples() -> list[dict[str, Any]]:
    return [
        {"index": i, "task_key": f"t{i % 7}", "tokens": [i, i + 1], "reward": i / 2}
        for i in range(N)
    ]


class ChunkCounter:
    """Counts the chunk readers made (one per chunk blob read) and those still alive."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        self.alive: weakref.WeakSet[ChunkReader] = weakref.WeakSet()
        counter = self

        class Counted(ChunkReader):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                counter.made += 1
                counter.alive.add(self)

        # archive.py imports ChunkReader from the codec package where it reads a chunk
        # (docs/architecture/start-up.md, "Start-up"): replaced there, every reader it makes is
        # counted.
        monkeypatch.setattr(codec_module, "ChunkReader", Counted)


@pytest.fixture
def arc(open_pool):
    """The archive on each catalog (the paging queries run on both)."""
    return open_pool(chunk_size=CHUNK).save("r", _samples(), rollout_id=1)


@pytest.fixture
def sqlite_arc(tmp_path):
    """The archive on SQLite only, for what does not depend on the catalog."""
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        yield pool.save("r", _samples(), rollout_id=1)


def test_iter_samples_streams_in_order_holding_at_most_two_chunks(arc, monkeypatch) -> None:
    monkeypatch.setattr(archive_module, "_PAGE", 5)  # entries come in pages of 5
    counter = ChunkCounter(monkeypatch)
    seen = []
    for i, sample in enumerate(arc.iter_samples()):
        seen.append(sample)
        # Chunk i // CHUNK is being yielded; at most the next one was read ahead.
        assert counter.made <= i // CHUNK + 2, (i, counter.made)
        assert len(counter.alive) <= 2
    assert seen == _samples()
    assert counter.made == -(-N // CHUNK)  # each chunk read once

    # A key reads only the chunks holding its samples, across pages, in order.
    counter.made = 0
    assert [s["index"] for s in arc.iter_samples(task_key="t3")] == [3, 10, 17, 24]
    assert counter.made == 4
    (last,) = arc.iter_samples(sample_key="sample:29", as_arrays=True)
    assert last["tokens"].tolist() == [29, 30]


def test_an_abandoned_stream_stops_reading(sqlite_arc, monkeypatch) -> None:
    counter = ChunkCounter(monkeypatch)
    stream = iter(sqlite_arc)
    assert next(stream) == _samples()[0]
    stream.close()
    assert counter.made <= 2 and not counter.alive
    assert not [t for t in threading.enumerate() if t.name.startswith("archive-stream")]


def test_iter_samples_checks_its_arguments_at_the_call(sqlite_arc) -> None:
    with pytest.raises(KeyError, match="task_key='nope'"):
        sqlite_arc.iter_samples(task_key="nope")
    with pytest.raises(InvalidInputError, match="as_arrays"):
        sqlite_arc.iter_samples(as_arrays="yes")
    with pytest.raises(InvalidInputError, match="sample_key"):
        sqlite_arc.iter_samples(sample_key=3)


def test_a_damaged_chunk_fails_the_stream_when_reached(sqlite_arc, blob_files_of) -> None:
    blobs = blob_files_of(sqlite_arc._pool)  # PoolContext: has .root, .store and .catalog
    blobs.flip_bit(blobs.chunks("r")[2])
    stream = sqlite_arc.iter_samples()
    assert [next(stream) for _ in range(2 * CHUNK)] == _samples()[: 2 * CHUNK]
    with pytest.raises(IntegrityError, match="archive 'r'"):
        next(stream)


# The child: chunk 1 read ahead (mapped, verified) while the caller holds sample 0, then its
# file truncated in place, as root's `cp` of a backup over a live pool does to each file.
_TRUNCATED_AHEAD = """
import os, sys, threading
import archive_manager.blobs.local as local_blobs
local_blobs._MAP_MIN = 1  # every chunk mapped, however small
import archive_manager.pool.archive as archive_module
from archive_manager import ArchiveManager
from archive_manager.errors import IntegrityError
read = threading.Event()
fetch_run = archive_module.Archive._fetch_run
def fetched(self, run):
    reader = fetch_run(self, run)
    if run[0] == 1:
        read.set()
    return reader
archive_module.Archive._fetch_run = fetched
pool = ArchiveManager.open(sys.argv[1], chunk_size=4)
arc = pool.save("r", [{"tokens": list(range(i, i + 300))} for i in range(12)], rollout_id=1)
path = pool.store.inner.path(arc.chunks()[1]["digest"])
stream = arc.iter_samples()
next(stream)
assert read.wait(60)
os.chmod(path, 0o644)
os.truncate(path, 0)
try:
    print(len(list(stream)), "more samples")
except IntegrityError as exc:
    print(exc)
"""


def test_a_chunk_truncated_after_it_was_read_ahead_fails_the_stream(tmp_path: Path) -> None:
    """A chunk file truncated in place after the stream read it ahead (a map of it, since
    7a7b3d5), while the caller's code ran: the stream raises IntegrityError naming it where
    reading on the map killed the process (SIGBUS; docs/architecture/reading.md, "Reading")."""
    done = run_python(_TRUNCATED_AHEAD, str(tmp_path / "pool"))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "archive 'r', chunk 1: blob " in done.stdout, done.stdout
    assert "was truncated while it was read" in done.stdout, done.stdout


def test_an_archive_is_a_sequence(arc, monkeypatch) -> None:
    expected = _samples()
    assert len(arc) == N and list(arc) == expected
    for i in (*range(-N, N), np.int64(3), True):
        assert arc[i] == expected[i]
    for bad in (N, -N - 1, 10**30):
        with pytest.raises(IndexError, match=f"no sample {bad}"):
            arc[bad]
    wrong: Any  # what indexing refuses
    for wrong in ("1", 1.0, None):
        with pytest.raises(InvalidInputError, match="integers or slices"):
            arc[wrong]
    slices = [
        slice(None), slice(2, 9), slice(-5, None), slice(None, None, 3), slice(None, None, -1),
        slice(25, 3, -4), slice(40, 50), slice(5, 5), slice(-100, 100, 7),
    ]  # fmt: skip
    for s in slices:
        assert arc[s] == expected[s], s
    counter = ChunkCounter(monkeypatch)
    assert arc[1::2] == expected[1::2]
    assert counter.made == -(-N // CHUNK)  # each chunk read once for the whole slice


def test_load_positions_in_any_order_reads_each_chunk_once(arc, monkeypatch) -> None:
    expected = _samples()
    positions = [29, 0, 5, 4, 28, 5, 17]
    counter = ChunkCounter(monkeypatch)
    loaded = arc.load_positions(positions)
    assert loaded == [expected[p] for p in positions]
    assert loaded[2] is loaded[5]  # a position given twice: the same object
    assert counter.made == len({p // CHUNK for p in positions})  # 0, 1, 4, 7: each once
    assert arc.load_positions([]) == []
    assert arc.load_positions(range(3), as_arrays=True)[2]["tokens"].tolist() == [2, 3]
    for bad in ([N], [-1]):
        with pytest.raises(IndexError, match=f"no sample at position {bad[0]}"):
            arc.load_positions(bad)
    not_positions: Any
    for not_positions in (["1"], [True], 3, "12"):
        with pytest.raises(InvalidInputError):
            arc.load_positions(not_positions)
