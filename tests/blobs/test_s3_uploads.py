"""A save's uploads through `put_new` (without the existence probe,
docs/architecture/object-stores.md "Blobs on an object store"), with real engines: an S3 server
(`tests/s3server.py`), processes killed with SIGKILL, GC racing saves, objects replaced behind the
pool's back, wrappers and third-party stores written before `put_new`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3 import s3_prefix, s3_root, s3_samples
from helpers import run_at_exit
from s3server import S3Server

from archive_manager import ArchiveManager
from archive_manager._util.digest import digest_of
from archive_manager.blobs import BlobStore
from archive_manager.blobs import s3 as s3mod
from archive_manager.blobs.base import PutItem
from archive_manager.blobs.s3 import S3BlobStore
from archive_manager.interop.synthetic import make_rollout
from archive_manager.testing import FaultyBlobStore
from archive_manager.testing.blob_store import flip_bit

REPO = str(Path(__file__).resolve().parents[2])


def _tokens(samples: Sequence[Any]) -> list[Any]:
    return [s.tokens for s in samples]


def _env(server: S3Server, **extra: str) -> dict[str, str]:
    return {**os.environ, **server.env(), "PYTHONPATH": REPO, **extra}


# --------------------------------------------------------------------------- old stores


class _LegacyStore(BlobStore):
    """A third-party store written before `put_new`: its put_many takes no ``workers`` (the
    writer used to call ``put_many(items)``), and it counts what it was asked to put."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.seen: list[str] = []

    def put_many(self, items: Sequence[PutItem]) -> list[str]:  # type: ignore[override]
        self.seen.extend(d for _, d in items if d is not None)
        return super().put_many(items)


class _LegacyStoreWithWorkers(BlobStore):
    """The same, with put_many's full signature: a save's puts all reach it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.seen: list[str] = []

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        self.seen.extend(d for _, d in items if d is not None)
        return super().put_many(items, workers=workers)


@pytest.mark.parametrize("kind", [_LegacyStore, _LegacyStoreWithWorkers])
def test_a_store_written_before_put_new_still_saves(tmp_path: Path, kind: type) -> None:
    # Break: put_new's default called put_many(items, workers=4): TypeError in every save
    # with a put_many(items) store.
    store = kind(tmp_path)
    samples = s3_samples(16)
    with ArchiveManager.open(tmp_path, store=store, chunk_size=8) as pool:
        archive = pool.save("a", samples, rollout_id=0)
        assert _tokens(archive.load_samples()) == _tokens(samples)
        assert archive.manifest_digest in store.seen
        assert pool.verify(read_data=True).ok


# --------------------------------------------------------------------------- wrappers on S3


def _count_blob_heads(store: S3BlobStore) -> list[str]:
    heads: list[str] = []
    store._client.meta.events.register(  # type: ignore[attr-defined]
        "before-parameter-build.s3.HeadObject",
        lambda params, **_: heads.append(params["Key"]) if "/blobs/" in params["Key"] else None,
    )
    return heads


def test_a_faulty_wrapper_around_s3_takes_the_put_new_path(s3_env: S3Server, bucket: str) -> None:
    # Break: FaultyBlobStore had no put_new, so the base class's sent put_new to the inner
    # store's put_many: a HEAD per blob, a path a save without the wrapper never takes.  (An
    # S3 pool takes no wrapped store, ArchiveManager.open refuses one; the store is tested.)
    inner = S3BlobStore(bucket, s3_prefix())
    heads = _count_blob_heads(inner)
    faulty = FaultyBlobStore(inner)
    items = [(os.urandom(1000 + i), None) for i in range(4)]
    digests = faulty.put_new(items, workers=2)
    assert heads == []
    assert faulty.calls["put"] == 4
    assert [inner.get(d) for d in digests] == [data for data, _ in items]
    # A planned put fault still fires on put_new; the items before it were put, whole.
    faulty.fail("put", OSError("injected"), nth=2)
    more = [(os.urandom(500), None), (os.urandom(600), None)]
    with pytest.raises(OSError, match="injected"):
        faulty.put_new(more)
    assert heads == []
    assert inner.get(inner.put(more[0][0])) == more[0][0]


def test_fault_injection_still_sees_a_saves_puts(tmp_path: Path) -> None:
    faulty = FaultyBlobStore(BlobStore(tmp_path))
    with ArchiveManager.open(tmp_path, store=faulty, chunk_size=8) as pool:
        samples = s3_samples(16)
        archive = pool.save("a", samples, rollout_id=0)
        assert faulty.calls["put"] >= 3  # two chunks and the manifest at least
        faulty.fail("put", OSError("injected"), nth=2)
        with pytest.raises(Exception, match="injected"):
            pool.save("b", s3_samples(16)[::-1], rollout_id=1)
        assert sorted(a.name for a in pool.find()) == ["a"]
        pool.gc(grace=0)
        assert _tokens(archive.load_samples()) == _tokens(samples)
        assert pool.verify(read_data=True).ok


class _CountingS3(S3BlobStore):
    """A subclass of the S3 store that meters its puts by overriding `put`."""

    puts = 0

    def put(self, data: Any, digest: str | None = None) -> str:
        type(self).puts += 1
        return super().put(data, digest)


def test_an_s3_subclass_overriding_put_still_sees_put_many(s3_env: S3Server, bucket: str) -> None:
    # Break: put_many went through the private _put instead of self.put, so a subclass's put
    # (metering, logging) no longer saw put_many's items, as it did before put_new.
    store = _CountingS3(bucket, s3_prefix())
    _CountingS3.puts = 0
    items = [(os.urandom(700 + i), None) for i in range(3)]
    assert store.put_many(items, workers=2) == [digest_of(d) for d, _ in items]
    assert _CountingS3.puts == 3


# --------------------------------------------------------------------------- upload threads


def test_a_forked_child_uploads_on_threads_of_its_own() -> None:
    """The kept upload threads are the process's: a child forked after the parent started
    them (a DataLoader worker) gets new ones, not the parent's executor, whose threads it
    does not have and whose queue nothing would ever drain."""
    uploaders = s3mod._Uploaders()
    parent = uploaders.executor()
    assert uploaders.executor() is parent  # kept
    assert parent.submit(lambda: 1).result(timeout=60) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether its executor is new and works, then leave
        try:
            mine = uploaders.executor()
            ok = mine is not parent and mine.submit(lambda: 2).result(timeout=30) == 2
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_uploads_run_on_the_callers_and_the_stores_kept_threads(
    s3_env: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Break: each put_new made a pool of its own, a thread started per item of every call (a
    # save calls it once per pair of chunks; under load the last uploads began up to 25 ms
    # apart), and the caller only waited.
    store = S3BlobStore(bucket, s3_prefix())
    senders: list[str] = []
    store._client.meta.events.register(  # type: ignore[attr-defined]
        "before-send.s3.PutObject",
        lambda **_: senders.append(threading.current_thread().name),
    )
    first = [(os.urandom(900 + i), None) for i in range(3)]
    assert [store.get(d) for d in store.put_new(first)] == [d for d, _ in first]
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    senders.clear()
    second = [(os.urandom(800 + i), None) for i in range(3)]
    assert store.put_new(second) == [digest_of(d) for d, _ in second]
    assert started == []
    assert len(senders) == 3 and threading.current_thread().name in senders
    # A copy of the store at another prefix uploads on the same threads.
    other = store._at(s3_root(bucket))
    assert other.put_many([(os.urandom(300), None), (os.urandom(301), None)], workers=2)
    assert started == []
    # The caller uploads too: an error of its own item must not skip the others' ends, and
    # the error raised is the first in the items' order, whichever thread met it.
    items = [(os.urandom(600 + i), None) for i in range(5)]
    bad = {digest_of(items[1][0]): "one", digest_of(items[3][0]): "three"}
    put = S3BlobStore._put

    def failing(self: S3BlobStore, data: Any, digest: str | None, *, look: bool) -> str:
        if digest in bad:
            raise OSError(f"injected {bad[digest]}")
        return put(self, data, digest, look=look)

    monkeypatch.setattr(S3BlobStore, "_put", failing)
    for call in (store.put_new, store.put_many):
        with pytest.raises(OSError, match="injected one"):
            call([(d, digest_of(d)) for d, _ in items], workers=3)
    for index in (0, 2, 4):
        assert store.has(digest_of(items[index][0]))
    assert started == []


# --------------------------------------------------------------------------- objects behind the pool


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


def _replace(store: S3BlobStore, digest: str, body: bytes) -> None:
    store._client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=body)


def _saved_chunk(pool: ArchiveManager, samples: list[Any]) -> tuple[S3BlobStore, str, bytes]:
    """Save ``samples`` as archive "a"; its store, its first chunk's digest and bytes."""
    store = pool.store
    assert isinstance(store, S3BlobStore)
    pool.save("a", samples, rollout_id=0)
    chunk = pool.open_archive("a").chunks()[0]["digest"]
    return store, chunk, store.get(chunk)


@pytest.mark.parametrize("how", ["same size", "shorter", "longer"])
def test_a_rowless_object_with_other_bytes_is_healed_by_the_next_save(
    s3_env: S3Server, bucket: str, tmp_path: Path, how: str
) -> None:
    # An orphan (no row) whose bytes are not its digest's: put_new replaces it whole.  Before
    # put_new the HEAD compared sizes only: the same size kept the damage under a published
    # archive, another size failed the save.
    samples = s3_samples(16)
    with ArchiveManager.open(s3_root(bucket), catalog_url=_sqlite(tmp_path), chunk_size=8) as pool:
        store, chunk, good = _saved_chunk(pool, samples)
        assert pool.open_archive("a").release()
        pool.gc(grace=0)
        bad = {
            "same size": flip_bit(good, len(good) // 2),
            "shorter": good[:-7],
            "longer": good + b"tail",
        }[how]
        _replace(store, chunk, bad)
        again = pool.save("b", samples, rollout_id=1)
        assert store.get(chunk) == good
        assert _tokens(again.load_samples()) == _tokens(samples)
        assert pool.verify(read_data=True).ok


@pytest.mark.xfail(
    strict=True,
    reason="a live row whose object was replaced behind the pool is not put again by a save "
    "of its content (the row is live, the key is there: has() is True), so the new archive "
    "is published over the damage; same-size damage shows only on a read of every shared "
    "blob, other sizes would need the existence probe to compare sizes (the filesystem "
    "store's has() opens rather than stats, for NFS caches): a design call for the owners; "
    "verify(read_data=True) reports it (pre-existing, not put_new's)",
)
@pytest.mark.parametrize("how", ["same size", "shorter"])
def test_a_live_object_replaced_behind_the_pool_is_healed_by_a_save(
    s3_env: S3Server, bucket: str, tmp_path: Path, how: str
) -> None:
    samples = s3_samples(16)
    with ArchiveManager.open(s3_root(bucket), catalog_url=_sqlite(tmp_path), chunk_size=8) as pool:
        store, chunk, good = _saved_chunk(pool, samples)
        bad = flip_bit(good, len(good) // 2) if how == "same size" else good[:-7]
        _replace(store, chunk, bad)
        again = pool.save("b", samples, rollout_id=1)
        assert _tokens(again.load_samples()) == _tokens(samples)
        assert pool.verify(read_data=True).ok


# --------------------------------------------------------------------------- crashes and races

_KILLED_SAVER = """
import os, signal, sys
from archive_manager import ArchiveManager
from archive_manager.interop.synthetic import make_rollout
root, url, name, nth = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
puts = []
def after_put(params, **_):
    if "/blobs/" in params["Key"]:
        puts.append(params["Key"])
        if len(puts) == nth:  # uploads of other threads are in flight
            os.kill(os.getpid(), signal.SIGKILL)
with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
    pool.store._client.meta.events.register("before-parameter-build.s3.PutObject", after_put)
    pool.save(name, make_rollout(24, response_min=32, response_max=96, seed=7), rollout_id=1)
"""


@pytest.mark.parametrize("nth", [2, 5])
def test_kill_9_mid_upload_then_the_same_content_again(
    s3_env: S3Server, bucket: str, tmp_path: Path, nth: int
) -> None:
    """SIGKILL a saver between blob PUTs (others in flight on its threads), save the same
    content again (its rows are 'writing' under a dead lease, some objects there, some not),
    GC, verify: every byte read back is its digest's."""
    root, url = s3_root(bucket), _sqlite(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVER, root, url, "victim", str(nth)],
        env=_env(s3_env),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    samples = make_rollout(24, response_min=32, response_max=96, seed=7)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
        # Before the dead lease expires: the rows are 'writing', put again over what is there.
        early = pool.save("early", samples, rollout_id=2)
        assert _tokens(early.load_samples()) == _tokens(samples)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4, lease_ttl=0.001) as pool:
        time.sleep(0.01)
        pool.gc(grace=0)  # the dead lease's rows and objects go
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
        late = pool.save("late", samples, rollout_id=3)
        pool.gc(grace=0)
        assert sorted(a.name for a in pool.find()) == ["early", "late"]
        for archive in (early, late):
            loaded = pool.open_archive(archive.name).load_samples()
            assert _tokens(loaded) == _tokens(samples)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems


def test_gc_never_aborts_the_multipart_upload_of_a_save_in_flight(
    s3_env: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save uploads a large blob in parts; between two parts a GC whose clock is two hours
    ahead of the store's (so the upload looks two hours old) runs beside it.  The save's
    lease is live: its upload is kept and the save publishes (an age rule alone aborted it,
    and the save failed with NoSuchUpload).  An upload no save holds is aborted by the same
    GC."""
    monkeypatch.setattr(s3mod, "MULTIPART_THRESHOLD", 6 << 20)
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 << 20)
    root, url = s3_root(bucket), _sqlite(tmp_path)
    hours = 3600.0
    big = np.frombuffer(os.urandom(12 << 20), dtype=np.uint8)
    with (
        ArchiveManager.open(root, catalog_url=url, lease_ttl=3 * hours) as saver,
        ArchiveManager.open(root, catalog_url=url, clock=lambda: time.time() + 2 * hours) as ahead,
    ):
        store = saver.store
        assert isinstance(store, S3BlobStore)
        stray = store._key(digest_of(b"no save holds this"))
        store._client.create_multipart_upload(Bucket=bucket, Key=stray)
        reports: list[Any] = []
        real = s3mod._upload_part

        def upload_part(client: Any, **request: Any) -> Any:
            if request["PartNumber"] == 2 and not reports:
                reports.append(ahead.gc(grace=0))
            return real(client, **request)

        monkeypatch.setattr(s3mod, "_upload_part", upload_part)
        archive = saver.save("big", [{"tokens": [1, 2, 3], "big": big}], rollout_id=0)
        [report] = reports
        assert report.temp_files == 1  # the stray upload, not the save's
        assert store.incomplete_writes() == []
        [loaded] = archive.load_samples()
        assert np.array_equal(loaded["big"], big)
        assert saver.verify(read_data=True).ok


_RACER = """
import sys, time
from archive_manager import ArchiveManager
from archive_manager.errors import ArchiveError
from archive_manager.interop.synthetic import make_rollout
root, url, role, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
samples = make_rollout(12, response_min=32, response_max=64, seed=11)
with ArchiveManager.open(root, catalog_url=url, chunk_size=4, lease_ttl=30) as pool:
    if role == "gc":
        end = time.monotonic() + rounds
        while time.monotonic() < end:
            try:
                pool.gc(grace=0)
            except ArchiveError as exc:  # a busy catalog: try again
                print("gc:", type(exc).__name__, exc, file=sys.stderr)
    else:
        for i in range(rounds):
            name = f"{role}-{i}"
            pool.save(name, samples, rollout_id=i)
            if i % 2 == 0:  # releases make the shared blobs orphans GC deletes
                pool.open_archive(name).release()
            print(name, flush=True)
"""


def test_two_savers_of_identical_content_and_gc_in_a_loop(
    s3_env: S3Server, bucket: str, tmp_path: Path
) -> None:
    """Two processes save the same content over and over (every other archive released, so
    its blobs become GC's) while a third runs gc(grace=0) in a loop: every published archive
    kept loads and verifies."""
    root, url = s3_root(bucket), _sqlite(tmp_path)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4):
        pass  # bind the catalog before the racers
    env = _env(s3_env)

    def start(role: str, rounds: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _RACER, root, url, role, str(rounds)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    savers = [start("p", 6), start("q", 6)]
    collector = start("gc", 12)
    outs = [p.communicate(timeout=180) for p in savers]
    collector.communicate(timeout=180)
    for proc, (_, err) in zip(savers, outs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    assert collector.returncode == 0
    samples = make_rollout(12, response_min=32, response_max=64, seed=11)
    with ArchiveManager.open(root, catalog_url=url, chunk_size=4) as pool:
        pool.gc(grace=0)
        names = sorted(a.name for a in pool.find())
        assert names == [f"{r}-{i}" for r in "pq" for i in (1, 3, 5)]
        for name in names:
            assert _tokens(pool.open_archive(name).load_samples()) == _tokens(samples)
        report = pool.verify(read_data=True)
        assert report.ok, report.problems


def test_a_save_a_read_and_an_export_made_at_exit_work_on_s3(
    s3_env: S3Server, bucket: str, tmp_path: Path
) -> None:
    """As tests/pool/test_save.py's twin, on S3: its uploads and reads go through threads."""
    run_at_exit(tmp_path, s3_root(bucket), _sqlite(tmp_path), _env(s3_env))
