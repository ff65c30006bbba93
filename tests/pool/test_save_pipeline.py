"""The save pipeline's costs (docs/architecture/save-protocol.md, "Save protocol"): chunks claimed
in pairs (one catalog transaction for two chunks, counted by the failpoint's hits), the chunks left
at commit claimed by the ownership transaction, no garbage collection during `pool.save`."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from archive_manager import ArchiveManager, codec
from archive_manager._util import failpoints as _failpoints
from archive_manager.catalog import lease_blobs_table, leases_table
from archive_manager.codec import chunk as chunk_module
from archive_manager.errors import UnencodableError
from archive_manager.pool import writer as writer_module

CHUNK = 2


def _samples(n: int) -> list[dict[str, Any]]:
    return [{"index": i, "tokens": [i, i + 1, i + 2], "reward": i / 4} for i in range(n)]


@pytest.fixture(autouse=True)
def _counted() -> Iterator[None]:
    # sleep:0 only counts the hits of a point.
    _failpoints.configure("save.blobs.before_commit=sleep:0")
    yield
    _failpoints.configure(None)


@pytest.fixture
def pool(open_pool) -> ArchiveManager:  # type: ignore[no-untyped-def]
    return open_pool(chunk_size=CHUNK)  # type: ignore[no-any-return]


def _blob_transactions() -> int:
    return _failpoints.hits("save.blobs.before_commit")


# The chunk filled last, if it waits for its pair, is claimed by the ownership transaction: a
# save of one chunk (n=2) has no blob transaction of its own.  `pool.save` knows its samples:
# the pair holding its last chunk is claimed there too (n=4, n=12).
@pytest.mark.parametrize(("n", "transactions"), [(1, 0), (2, 0), (4, 0), (10, 2), (12, 2)])
def test_a_save_claims_its_chunks_in_pairs(pool: ArchiveManager, n: int, transactions: int) -> None:
    samples = _samples(n)
    arc = pool.save("a", samples, rollout_id=1)
    assert _blob_transactions() == transactions
    assert arc.load_samples() == samples
    assert pool.verify(read_data=True).ok


class _Lying(list):  # type: ignore[type-arg]
    """A sequence of samples whose length says fewer than it holds."""

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize(("n", "leases"), [(1, 0), (4, 0), (5, 1)])
def test_a_small_save_takes_its_lease_in_its_ownership_transaction(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, n: int, leases: int
) -> None:
    """A `pool.save` whose chunks all go with the manifest (at most a pair of chunks'
    samples) has two catalog transactions, ownership (which checks the name and takes the
    lease) and publication, and no read after them: one commit less, and no read transaction
    for the archive it returns (docs/architecture/save-protocol.md, "Save protocol", steps 1
    and 5).  Between the two, the lease is there, with its holder, and holds nothing (the
    archive owns its blobs).  A larger save takes its lease first, as before."""
    _failpoints.configure(
        ";".join(
            f"{point}.before_commit=sleep:0"
            for point in ("save.blobs", "save.lease", "save.ownership", "save.publish")
        )
    )
    seen: list[Any] = []  # rows
    publish = writer_module.ArchiveWriter._publish

    def looked(writer: writer_module.ArchiveWriter, *args: Any) -> None:
        with pool.catalog.read() as conn:
            seen.extend(conn.execute(select(leases_table.c.archive_name, leases_table.c.holder)))
            seen.extend(conn.execute(select(lease_blobs_table)))
        publish(writer, *args)

    monkeypatch.setattr(writer_module.ArchiveWriter, "_publish", looked)
    reads = 0
    read = type(pool.catalog).read

    def counted(catalog: Any) -> Any:
        nonlocal reads
        reads += 1
        return read(catalog)

    samples = _samples(n)
    monkeypatch.setattr(type(pool.catalog), "read", counted)
    arc = pool.save("a", samples, rollout_id=1)
    monkeypatch.setattr(type(pool.catalog), "read", read)
    assert (reads, _failpoints.hits("save.lease.before_commit")) == (1, leases)  # `looked`'s
    assert _failpoints.hits("save.ownership.before_commit") == 1
    assert _failpoints.hits("save.publish.before_commit") == 1
    assert len(seen) == 1 and seen[0].archive_name == "a" and seen[0].holder is not None
    assert arc.load_samples() == samples
    # A sequence longer than its length: the deferred lease is taken before the first blob
    # transaction, which needs it.
    longer = _Lying(_samples(3 * CHUNK))
    assert pool.save("b", longer, rollout_id=1).load_samples() == list(longer)
    assert _failpoints.hits("save.lease.before_commit") == leases + 1
    assert pool.verify(read_data=True).ok


@pytest.mark.parametrize(("n", "transactions"), [(4, 1), (10, 2), (12, 3)])
def test_a_streaming_writer_stores_every_full_pair(
    pool: ArchiveManager, n: int, transactions: int
) -> None:
    """A writer does not know which sample is its last: every pair is stored as it fills."""
    samples = _samples(n)
    with pool.writer("a", rollout_id=1) as writer:
        for sample in samples:
            writer.add(sample)
    assert _blob_transactions() == transactions
    assert pool.open_archive("a").load_samples() == samples


def test_a_small_save_starts_no_thread(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of fewer samples than a chunk packs and writes its chunk on the caller's thread
    and ends before its lease needs renewing: no heartbeat, packer, I/O or store thread is
    started (each start cost ~1.5 ms of a small save on a loaded machine;
    docs/performance.md, "Small saves").  The threads that sync files together are the
    process's, started by its first save and kept."""
    pool.save("first", _samples(CHUNK - 1), rollout_id=1)
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    arc = pool.save("a", _samples(CHUNK - 1), rollout_id=1)
    assert started == []
    monkeypatch.setattr(threading.Thread, "start", start)
    assert arc.load_samples() == _samples(CHUNK - 1)


def test_the_gil_is_handed_over_only_while_a_chunk_is_in_flight(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoding hands the GIL over (a sleep) so that the packer and the I/O thread get it; with
    neither running nobody takes it, and the sleep gave the core to other processes (a small
    save lost ~2.5 ms a hand-over on a loaded machine; docs/performance.md, "Small saves")."""
    monkeypatch.setattr(chunk_module, "_HAND_OVER_EVERY", -1.0)  # due at every sample
    handed: list[int] = []
    monkeypatch.setattr(codec.GilHandOver, "__call__", lambda self: handed.append(1))
    samples = _samples(CHUNK + 1)
    pool.save("a", samples[: CHUNK - 1], rollout_id=1)
    assert handed == []
    # A chunk still packing on the packer: the next sample hands the GIL over.
    release = threading.Event()
    pack = codec.RawChunk.pack

    def held(self: codec.RawChunk, **kwargs: Any) -> codec.EncodedChunk:
        release.wait(60)
        return pack(self, **kwargs)

    monkeypatch.setattr(codec.RawChunk, "pack", held)
    writer = pool.writer("b", rollout_id=1)
    for sample in samples:
        writer.add(sample)
    assert handed == [1]
    release.set()
    writer.commit()
    assert pool.open_archive("b").load_samples() == samples


def _encode_slowly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sample takes 0.3 s of real time to encode (not a synchronisation)."""
    prepare = writer_module.prepare_sample

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(writer_module, "prepare_sample", slow)


@pytest.mark.slow  # real-time lease renewals (tests/README.md, "slow")
def test_a_slow_pool_save_still_renews_its_lease(
    open_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pool.save` starts its heartbeat once the save has run a renewal interval: samples
    that take longer to encode than the lease lives still publish."""
    pool = open_pool(chunk_size=CHUNK, lease_ttl=1.5)  # renewed every 0.5 s
    _encode_slowly(monkeypatch)
    samples = _samples(8)  # 2.4 s of encoding, past the 1.5 s lease
    arc = pool.save("a", samples, rollout_id=1)
    assert arc.load_samples() == samples


@pytest.mark.slow  # real-time lease renewals (tests/README.md, "slow")
def test_a_slow_small_save_renews_the_lease_its_ownership_transaction_took(
    open_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save small enough to take its lease in its ownership transaction, which has run a
    renewal interval by then, starts its heartbeat once that commits: writing its files and
    publishing may outlast the lease. The heartbeat was left unstarted, and such a save
    failed with LeaseExpiredError after writing everything."""
    pool = open_pool(chunk_size=CHUNK, lease_ttl=1.5)  # renewed every 0.5 s
    _encode_slowly(monkeypatch)
    samples = _samples(2 * CHUNK)  # one pair of chunks: the lease is deferred
    collected: list[Any] = []

    def collect_once_the_lease_would_have_lapsed() -> None:
        while not _failpoints.hits("save.manifest.after_write"):
            time.sleep(0.01)
        time.sleep(2.0)  # real time past the lease the ownership transaction took (1.5 s)
        collected.append(open_pool().gc(grace=0))  # the same pool, opened again

    _failpoints.configure("save.manifest.after_write=sleep:3")  # step 4 outlasts the lease
    collector = threading.Thread(target=collect_once_the_lease_would_have_lapsed, daemon=True)
    collector.start()
    try:
        arc = pool.save("a", samples, rollout_id=1)
    finally:
        _failpoints.configure(None)
        collector.join(60)
    assert collected, "the collection did not run"
    assert arc.load_samples() == samples


def _within(seconds: float, fn: Any) -> None:
    """Run ``fn`` on a thread; fail (instead of hanging the suite) if it does not return."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not return within {seconds} s"
    if errors:
        raise errors[0]


def test_wait_stored_stores_a_chunk_that_waits_for_its_pair(pool: ArchiveManager) -> None:
    samples = _samples(6)
    writer = pool.writer("a", rollout_id=1)
    for sample in samples[:CHUNK]:
        writer.add(sample)
    # The chunk's store waits for the next chunk to pair with: waiting must end that.
    _within(60, writer.wait_stored)
    assert _blob_transactions() == 1
    with pool.catalog.read() as conn:
        held = conn.execute(
            lease_blobs_table.select().where(lease_blobs_table.c.lease == writer.lease)
        ).all()
    assert len(held) == 1
    for sample in samples[CHUNK:]:
        writer.add(sample)
    _within(60, writer.commit)
    assert _blob_transactions() == 2  # the chunk stored alone, then the next two together
    assert pool.open_archive("a").load_samples() == samples


def test_abort_and_abandon_end_a_store_waiting_for_its_pair(pool: ArchiveManager) -> None:
    samples = _samples(CHUNK)
    aborted = pool.writer("a", rollout_id=1)
    for sample in samples:
        aborted.add(sample)
    _within(60, aborted.abort)
    abandoned = pool.writer("b", rollout_id=1)
    for sample in samples:
        abandoned.add(sample)
    _within(60, abandoned.abandon)


def test_a_writer_made_to_fail_after_a_lone_chunk_rolls_back(pool: ArchiveManager) -> None:
    writer = pool.writer("a", rollout_id=1)
    for sample in _samples(CHUNK):
        writer.add(sample)
    with pytest.raises(UnencodableError):
        writer.add({"bad": object()})
    _within(60, writer.abort)
    assert pool.find(state=None) == []


def test_pool_save_runs_without_garbage_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full collection walks the caller's whole heap (a training process's, the samples').
    seen: list[tuple[str, bool]] = []

    def spied(name: str) -> Any:
        original = getattr(writer_module.ArchiveWriter, name)

        def spy(self: writer_module.ArchiveWriter, *args: Any, **kwargs: Any) -> Any:
            seen.append((name, gc.isenabled()))
            return original(self, *args, **kwargs)

        return spy

    for name in ("add", "_commit_ownership", "abort"):
        monkeypatch.setattr(writer_module.ArchiveWriter, name, spied(name))
    samples = _samples(9)
    with ArchiveManager.open(tmp_path / "pool", chunk_size=CHUNK) as pool:
        assert gc.isenabled()
        pool.save("a", samples, rollout_id=1)
        assert gc.isenabled()
        assert {name for name, _ in seen} == {"add", "_commit_ownership"}
        assert [name for name, enabled in seen if enabled] == []
        seen.clear()
        with pytest.raises(UnencodableError):
            pool.save("b", [*samples, {"bad": object()}], rollout_id=1)
        assert gc.isenabled()
        assert ("abort", False) in seen
        assert [name for name, enabled in seen if enabled] == []
        assert pool.open_archive("a").load_samples() == samples
        # A streaming writer's caller runs between adds: its collector is left alone.
        seen.clear()
        with pool.writer("c", rollout_id=1) as writer:
            writer.add(samples[0])
        assert seen == [("add", True), ("_commit_ownership", True)]


WORKTREE = Path(__file__).resolve().parents[2]


# A process whose writer is left open (neither committed nor aborted: user code failed, or
# the writer is simply dropped) with an odd number of chunks flushed.
_LEFT_OPEN = """
import sys
from archive_manager import ArchiveManager
pool = ArchiveManager.open(sys.argv[1], chunk_size=2)
writer = pool.writer("a", rollout_id=1)
for i in range(int(sys.argv[2])):
    writer.add({"index": i, "tokens": [1, 2]})
if sys.argv[3] == "drop":
    del writer
elif sys.argv[3] == "raise":
    raise SystemExit("the training step failed")
"""


def _run_left_open(root: Path, samples: int, how: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVE_MANAGER_")}
    env["PYTHONPATH"] = str(WORKTREE)
    return subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(root / "pool"), str(samples), how],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_process_leaving_a_writer_open_after_one_chunk_exits(tmp_path: Path) -> None:
    # Break: the store of chunk 0 waits for chunk 1 to pair with, on a non-daemon I/O thread
    # that the interpreter joins at exit: a process that left its writer open after an odd
    # number of chunks hung forever at exit (before chunks were claimed in pairs, such a process exited).
    for samples, how in [(2, "keep"), (2, "drop"), (6, "raise")]:
        done = _run_left_open(tmp_path / f"{samples}-{how}", samples, how)
        assert done.returncode == (1 if how == "raise" else 0), done.stderr
