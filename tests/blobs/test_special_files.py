"""Symlinks, FIFOs, devices and folders where the pool expects its own folders and files.

The pool's folders (``blobs/``, ``tmp/``, the fan-out folders) must be real directories: a
symlink there is refused (`PoolLayoutError`; GC stops with `GcAbortedError`) and nothing is
read, written, listed or unlinked through it.  A blob is read only from a regular file: a FIFO,
a directory or a symlink (say, to ``/dev/zero``) at its path is an `IntegrityError` naming the
blob, never a hang, and a problem in ``verify``.  A file that vanishes while GC lists or
unlinks is skipped.  A symlinked pool *root* is normal.

Blob-store behaviour is tested on `BlobStore` alone; pool behaviour on SQLite only, since the
catalog plays no part in what happens to files.  Every test that could hang on old code has a
timeout, so a regression fails instead.
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import FakeClock, assert_loads, folder_store, local_store, tiny_rollout, wall_clock
from sqlalchemy import select

from archive_manager import ArchiveManager, materialize_tensor_refs
from archive_manager._util.digest import digest_of
from archive_manager.blobs import BlobStore
from archive_manager.blobs import local as blobs
from archive_manager.catalog import archive_blobs_table, archives_table, chunks_table
from archive_manager.cli import cli
from archive_manager.errors import (
    GcAbortedError,
    IntegrityError,
    InvalidNameError,
    PoolLayoutError,
)

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0
OLD = 100 * HOUR  # far older than any grace period or the temp files' floor


# --------------------------------------------------------------------------- helpers


def age(path: Path, seconds: float, now: float) -> None:
    os.utime(path, (now - seconds, now - seconds), follow_symlinks=False)


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (relative path -> kind and content), links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = "file:" + p.read_bytes().hex()
            else:
                out[rel] = "dir"
    return out


def remove_folder(folder: Path) -> None:
    """``rm -r`` with listdir, not scandir: tests call it from a patched `os.scandir`."""
    for name in os.listdir(folder):
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            remove_folder(p)
        else:
            p.unlink()
    folder.rmdir()


def move_out(folder: Path, outside: Path) -> None:
    """Move ``folder`` to ``outside`` and leave a symlink to it in its place."""
    shutil.move(str(folder), str(outside))
    folder.symlink_to(outside, target_is_directory=True)


def replace_with(path: Path, what: str) -> None:
    """Put ``what`` (fifo, directory, /dev/zero link) at a blob file's path."""
    path.parent.chmod(0o755)
    path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")


NOT_FILES = ["fifo", "directory", "dev-zero-link"]
KIND_WORD = {"fifo": "FIFO", "directory": "directory", "dev-zero-link": "symlink"}


@pytest.fixture
def bounded_memory() -> Iterator[None]:
    """Cap this process's address space at 2 GiB above its current size for the test.

    A regression that reads ``/dev/zero`` into memory then fails with MemoryError within a
    second, instead of growing past the machine's memory before the timeout could stop it
    (a read in C is not interrupted by the timeout's signal).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        pytest.skip("cannot measure this process's address space")
    limit = size + (2 << 30)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "pool")


@pytest.fixture
def clock() -> FakeClock:
    return wall_clock()


@pytest.fixture
def pool(tmp_path: Path, clock: FakeClock) -> Iterator[ArchiveManager]:
    # inline_limit=64: routed-expert tensors become tensor blobs, loaded lazily.
    with ArchiveManager.open(
        tmp_path / "pool", clock=clock, chunk_size=4, inline_limit=64
    ) as opened:
        yield opened


def digests_of(pool: ArchiveManager, name: str, kind: str) -> list[str]:
    ab, a = archive_blobs_table, archives_table
    with pool.catalog.read() as conn:
        return sorted(
            conn.execute(
                select(ab.c.digest)
                .join(a, a.c.id == ab.c.archive_id)
                .where(a.c.name == name, ab.c.kind == kind)
            ).scalars()
        )


def first_chunk(pool: ArchiveManager, name: str) -> str:
    c, a = chunks_table, archives_table
    with pool.catalog.read() as conn:
        return conn.execute(
            select(c.c.digest)
            .join(a, a.c.id == c.c.archive_id)
            .where(a.c.name == name, c.c.ordinal == 0)
        ).scalar_one()


# --------------------------------------------------------------------------- the store alone


def test_a_symlinked_tmp_is_refused_and_nothing_is_written_or_swept_there(
    store: BlobStore, tmp_path: Path
) -> None:
    store.put(b"makes the folders")
    outside = tmp_path / "shared-scratch"
    outside.mkdir()
    (outside / "someone-else.tmp").write_bytes(b"not the pool's")
    (outside / "notes.txt").write_bytes(b"not the pool's either")
    before = tree(outside)
    shutil.rmtree(store.root / "tmp")
    (store.root / "tmp").symlink_to(outside, target_is_directory=True)

    with pytest.raises(PoolLayoutError, match="tmp is a symlink"):
        store.put(b"a new blob")
    with pytest.raises(PoolLayoutError):
        store.put_many([(b"one", None), (b"two", None)])
    with pytest.raises(PoolLayoutError):
        store.temp_files()
    with pytest.raises(PoolLayoutError):
        store.remove_temp(store.root / "tmp" / "someone-else.tmp")
    assert tree(outside) == before
    assert isinstance(PoolLayoutError("x"), OSError)  # GC's listing guard catches it


@pytest.mark.parametrize("level", ["blobs", "fan-out", "second fan-out"])
def test_a_symlinked_blob_folder_is_refused_everywhere(
    store: BlobStore, tmp_path: Path, level: str
) -> None:
    digest = store.put(b"lives behind a link")
    folder = {
        "blobs": store.root / "blobs",
        "fan-out": store.path(digest).parent.parent,
        "second fan-out": store.path(digest).parent,
    }[level]
    move_out(folder, tmp_path / "elsewhere")
    before = tree(tmp_path / "elsewhere")

    for op in ("get", "get_view", "open", "check", "has", "size", "delete"):
        with pytest.raises(PoolLayoutError, match=f"blob {digest}: .* is a symlink"):
            getattr(store, op)(digest)
    with pytest.raises(PoolLayoutError):
        store.put(b"lives behind a link")
    with pytest.raises(PoolLayoutError):
        list(store.iter_stat())
    with pytest.raises(PoolLayoutError):
        list(store.iter_digests())
    assert tree(tmp_path / "elsewhere") == before


def test_a_new_blob_is_never_renamed_into_a_linked_folder(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fan-out folder becomes a link between the temp write and the rename.
    data = b"renamed late"
    digest = digest_of(data)
    target_folder = store.path(digest).parent
    real = store._begin

    def begin(d: str, views: list) -> Any:
        pending = real(d, views)
        target_folder.parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "elsewhere").mkdir()
        target_folder.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        return pending

    monkeypatch.setattr(store, "_begin", begin)
    with pytest.raises(PoolLayoutError):
        store.put(data)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert list((store.root / "tmp").iterdir()) == []


def test_a_blob_path_that_is_a_symlink_is_never_read_nor_deleted_through(
    store: BlobStore, tmp_path: Path
) -> None:
    data = b"the right bytes, outside the pool"
    digest = digest_of(data)
    outside = tmp_path / "copy"
    outside.write_bytes(data)  # even the right bytes: a link is not the pool's blob
    store.put(b"makes the folders")
    path = store.path(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside)

    for op in ("get", "get_view", "open", "check", "size"):
        with pytest.raises(IntegrityError, match=f"blob {digest} is not a regular file.*symlink"):
            getattr(store, op)(digest)
    assert store.has(digest) is False
    assert digest not in set(store.iter_digests())
    with pytest.raises(IntegrityError, match="not a regular file"):
        store.put(data)  # not taken for a stored copy
    assert store.delete(digest) is True  # the link goes, its target stays
    assert not path.is_symlink() and outside.read_bytes() == data
    assert store.put(data) == digest and store.get(digest) == data


@pytest.mark.timeout(20)
@pytest.mark.parametrize("what", NOT_FILES)
def test_a_non_file_at_a_blob_path_is_an_integrity_error_not_a_hang(
    store: BlobStore, what: str, bounded_memory: None
) -> None:
    data = b"a small blob"
    digest = store.put(data)
    replace_with(store.path(digest), what)
    for op in ("get", "get_view", "open", "check", "size"):
        with pytest.raises(IntegrityError, match=f"blob {digest} is not a regular file: .* is a"):
            getattr(store, op)(digest)
    assert store.has(digest) is False
    assert list(store.iter_stat()) == []
    with pytest.raises(IntegrityError, match="not a regular file"):
        store.put(data)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("what", NOT_FILES)
def test_an_empty_blob_is_not_taken_for_a_non_file(
    store: BlobStore, what: str, bounded_memory: None
) -> None:
    # A FIFO, a folder and /dev/zero all stat as 0 bytes: the size check alone would dedup.
    digest = store.put(b"")
    replace_with(store.path(digest), what)
    with pytest.raises(IntegrityError, match="not a regular file"):
        store.put(b"")
    with pytest.raises(IntegrityError, match="not a regular file"):
        store.get(digest)


def test_only_regular_temp_files_are_temp_files(store: BlobStore, tmp_path: Path) -> None:
    store.put(b"makes the folders")
    tmp = store.root / "tmp"
    real = tmp / "dead-writer.tmp"
    real.write_bytes(b"half a blob")
    (tmp / "notes.txt").write_bytes(b"an operator's")
    (tmp / "sub.tmp").mkdir()
    (tmp_path / "target.tmp").write_bytes(b"outside")
    (tmp / "link.tmp").symlink_to(tmp_path / "target.tmp")
    assert [p for p, _ in store.temp_files()] == [real]
    with pytest.raises(InvalidNameError):
        store.remove_temp(tmp / "notes.txt")
    assert store.remove_temp(tmp / "link.tmp") is False  # not a regular file: left alone
    assert (tmp / "link.tmp").is_symlink() and (tmp_path / "target.tmp").exists()
    assert store.remove_temp(tmp / "sub.tmp") is False
    assert store.remove_temp(real) is True
    assert sorted(p.name for p in tmp.iterdir()) == ["link.tmp", "notes.txt", "sub.tmp"]


@pytest.mark.parametrize("level", ["fan-out", "second fan-out"])
def test_a_folder_that_vanishes_while_listed_is_skipped(
    store: BlobStore, monkeypatch: pytest.MonkeyPatch, level: str
) -> None:
    kept = store.put(b"stays")
    gone = next(
        store.put(bytes([i]) * 3) for i in range(256) if digest_of(bytes([i]) * 3)[:2] != kept[:2]
    )
    folder = store.path(gone).parent.parent if level == "fan-out" else store.path(gone).parent
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        # Another process removes the folder after its parent was listed.
        if isinstance(path, str) and Path(path) == folder:
            remove_folder(folder)
        return real_scandir(path)

    monkeypatch.setattr(blobs.os, "scandir", scandir)
    assert [d for d, _, _ in store.iter_stat()] == [kept]


def test_a_symlinked_root_is_a_normal_pool(tmp_path: Path) -> None:
    real = tmp_path / "disk" / "pool"
    real.mkdir(parents=True)
    (tmp_path / "pool").symlink_to(real, target_is_directory=True)
    store = BlobStore(tmp_path / "pool")
    digest = store.put(b"through the root link")
    assert store.get(digest) == b"through the root link"
    assert [d for d, _, _ in store.iter_stat()] == [digest]
    assert store.temp_files() == []
    assert store.delete(digest)


# --------------------------------------------------------------------------- the pool


def released_pool(pool: ArchiveManager, clock: FakeClock) -> dict[str, str]:
    """A pool where GC has work: a released archive, an old orphan, an old temp file."""
    pool.save("kept", tiny_rollout(seed=1), rollout_id=1)
    pool.save("gone", tiny_rollout(seed=2), rollout_id=2).release()
    age(local_store(pool).path(pool.store.put(b"orphan")), OLD, clock.now)
    (pool.root / "tmp").mkdir(exist_ok=True)
    dead = pool.root / "tmp" / "dead-writer.tmp"
    dead.write_bytes(b"half a blob")
    age(dead, OLD, clock.now)
    return tree(pool.root / "blobs")


def test_gc_with_tmp_linked_to_a_shared_folder_deletes_nothing(
    pool: ArchiveManager, clock: FakeClock, tmp_path: Path
) -> None:
    blobs_before = released_pool(pool, clock)
    shared = tmp_path / "shared"
    shared.mkdir()
    for name in ("x.tmp", "results.csv", "deadbeef.1.abc.tmp"):
        (shared / name).write_bytes(b"someone else's")
        age(shared / name, OLD, clock.now)
    shared_before = tree(shared)
    shutil.rmtree(pool.root / "tmp")
    (pool.root / "tmp").symlink_to(shared, target_is_directory=True)

    for dry_run in (True, False):
        with pytest.raises(GcAbortedError, match=r"before deleting anything.*tmp is a symlink"):
            pool.gc(grace=0, dry_run=dry_run)
    assert tree(shared) == shared_before
    assert tree(pool.root / "blobs") == blobs_before

    # Once the link is a real folder again, GC does its work.
    (pool.root / "tmp").unlink()
    (pool.root / "tmp").mkdir()
    report = pool.gc(grace=0)
    assert report.blobs > 0 and report.orphans == 1
    assert tree(shared) == shared_before
    assert_loads(pool, "kept", tiny_rollout(seed=1))


@pytest.mark.parametrize("level", ["blobs", "fan-out", "second fan-out"])
def test_gc_with_a_linked_blob_folder_deletes_nothing(
    pool: ArchiveManager, clock: FakeClock, tmp_path: Path, level: str
) -> None:
    released_pool(pool, clock)
    doomed = digests_of(pool, "gone", "chunk")[0]
    folder = {
        "blobs": pool.root / "blobs",
        "fan-out": local_store(pool).path(doomed).parent.parent,
        "second fan-out": local_store(pool).path(doomed).parent,
    }[level]
    elsewhere = tmp_path / "elsewhere"
    move_out(folder, elsewhere)
    # Old files with canonical names out there, as in another pool: orphans to a blind GC.
    strays = [elsewhere / "stray", elsewhere / digest_of(b"stray")]
    for p in strays:
        p.write_bytes(b"not this pool's")
        age(p, OLD, clock.now)
    before = tree(elsewhere)
    for dry_run in (True, False):
        with pytest.raises(GcAbortedError, match=r"before deleting anything.*is a symlink"):
            pool.gc(grace=0, dry_run=dry_run)
    assert tree(elsewhere) == before
    assert (pool.root / "tmp" / "dead-writer.tmp").exists()
    with pytest.raises(PoolLayoutError, match="is a symlink"):
        pool.verify()


def test_gc_unlinks_a_symlink_at_a_doomed_blob_path_not_its_target(
    pool: ArchiveManager, clock: FakeClock, tmp_path: Path
) -> None:
    pool.save("gone", tiny_rollout(seed=2), rollout_id=2).release()
    doomed = digests_of(pool, "gone", "chunk")[0]
    path = local_store(pool).path(doomed)
    outside = tmp_path / "precious"
    outside.write_bytes(path.read_bytes())
    replace = path.parent
    replace.chmod(0o755)
    path.unlink()
    path.symlink_to(outside)
    pool.gc(grace=0)
    assert not os.path.lexists(path)
    assert outside.exists()


# The thread method: load_samples reads chunks on a read-ahead thread, where a blocked open
# would outlast the signal method's exception in the main thread (it waits for the reader).
@pytest.mark.timeout(20, method="thread")
@pytest.mark.parametrize("what", NOT_FILES)
def test_a_non_file_at_a_chunk_path_fails_load_and_verify_cleanly(
    pool: ArchiveManager, what: str, bounded_memory: None
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = first_chunk(pool, "a")
    replace_with(local_store(pool).path(digest), what)
    with pytest.raises(IntegrityError, match=f"archive 'a', chunk 0: blob {digest} is not a"):
        pool.open_archive("a").load_samples()
    for read_data in (False, True):
        report = pool.verify(read_data=read_data)
        assert not report.ok
        corrupt = [f for f in report.problems if f.kind == "corrupt-blob"]
        assert [(f.digest, f.archive) for f in corrupt] == [(digest, "a")]
        assert f"is a {KIND_WORD[what]}" in corrupt[0].message


@pytest.mark.timeout(20)
@pytest.mark.parametrize("what", NOT_FILES)
def test_a_non_file_at_a_tensor_path_fails_materialisation_cleanly(
    pool: ArchiveManager, what: str, bounded_memory: None
) -> None:
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = digests_of(pool, "a", "tensor")[0]
    samples = pool.open_archive("a").load_samples()  # tensors stay lazy: this works
    replace_with(local_store(pool).path(digest), what)
    with pytest.raises(IntegrityError, match=f"tensor blob: blob {digest} is not a regular file"):
        for sample in samples:
            materialize_tensor_refs(sample)
    report = pool.verify(read_data=True)
    assert [f.digest for f in report.problems if f.kind == "corrupt-blob"] == [digest]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("when", ["before the read", "after it vanished"])
def test_a_blob_replaced_by_a_fifo_while_verify_reads_is_a_problem(
    pool: ArchiveManager, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    # Listed as a file, then replaced: the read must not block, nor the recheck of a blob
    # that vanished mid-read take the FIFO for its file.
    pool.save("a", tiny_rollout(), rollout_id=1)
    digest = first_chunk(pool, "a")
    path = local_store(pool).path(digest)
    real_check = pool.store.check

    def check(d: str) -> None:
        if d == digest and when == "before the read":
            replace_with(path, "fifo")
        elif d == digest:
            path.unlink()
            try:
                real_check(d)  # BlobNotFoundError: judged after the reads
            finally:
                os.mkfifo(path)
        real_check(d)

    monkeypatch.setattr(pool.store, "check", check)
    report = pool.verify(read_data=True)
    assert [f.digest for f in report.problems if f.kind == "corrupt-blob"] == [digest]


def test_files_that_vanish_during_gc_are_skipped(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    released_pool(pool, clock)
    # Gone by the time GC unlinks them (another GC got there first): "gone"'s tensors and
    # manifest (rows GC marks deleting) and the orphan (a file with no row).
    vanishing = {
        *digests_of(pool, "gone", "tensor"),
        *digests_of(pool, "gone", "manifest"),
        digest_of(b"orphan"),
    }
    store = folder_store(pool)
    real_listing = store.iter_stat

    def iter_stat() -> Iterator[tuple[str, int, float]]:
        for digest, size, mtime in real_listing():
            yield digest, size, mtime
            if digest in vanishing:
                store.delete(digest)

    real_delete = store.delete

    def delete(digest: str) -> bool:
        # A store whose delete says "gone" with FileNotFoundError rather than False.
        if not real_delete(digest):
            raise FileNotFoundError(2, "No such file or directory", digest)
        return True

    monkeypatch.setattr(store, "iter_stat", iter_stat)
    monkeypatch.setattr(store, "delete", delete)
    report = pool.gc(grace=0)
    assert report.orphans == 1 and report.blobs == len(digests_of(pool, "gone", "chunk")) + len(
        vanishing - {digest_of(b"orphan")}
    )
    monkeypatch.undo()
    assert pool.verify().ok
    assert_loads(pool, "kept", tiny_rollout(seed=1))
    assert pool.gc(grace=0).blobs == 0


def test_gc_survives_a_fan_out_folder_vanishing_while_listed(
    pool: ArchiveManager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    released_pool(pool, clock)
    orphan = digest_of(b"orphan")
    folder = local_store(pool).path(orphan).parent
    assert [p.name for p in folder.iterdir()] == [orphan]
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if isinstance(path, str) and Path(path) == folder and folder.exists():
            remove_folder(folder)
        return real_scandir(path)

    monkeypatch.setattr(blobs.os, "scandir", scandir)
    report = pool.gc(grace=0)
    assert report.blobs > 0
    monkeypatch.undo()
    assert_loads(pool, "kept", tiny_rollout(seed=1))


def test_cli_gc_with_a_linked_tmp_is_one_error_line(
    pool: ArchiveManager, clock: FakeClock, tmp_path: Path
) -> None:
    released_pool(pool, clock)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "old.tmp").write_bytes(b"someone else's")
    age(shared / "old.tmp", OLD, clock.now)
    shutil.rmtree(pool.root / "tmp")
    (pool.root / "tmp").symlink_to(shared, target_is_directory=True)
    result = CliRunner().invoke(cli, ["--root", str(pool.root), "gc", "--grace", "0s", "--yes"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gc stopped before deleting anything")
    assert "tmp is a symlink" in lines[0]
    assert (shared / "old.tmp").exists()


def test_pool_opened_through_a_symlinked_root_works(tmp_path: Path) -> None:
    real = tmp_path / "mnt" / "pool"
    real.mkdir(parents=True)
    (tmp_path / "pool").symlink_to(real, target_is_directory=True)
    samples = tiny_rollout()
    with ArchiveManager.open(tmp_path / "pool", inline_limit=64) as pool:
        pool.save("a", samples, rollout_id=1).release()
        assert_loads(pool, "a", samples)
        assert pool.verify(read_data=True).ok
        assert pool.gc(grace=0).blobs > 0
    assert stat.S_ISDIR(os.lstat(real / "blobs").st_mode)
