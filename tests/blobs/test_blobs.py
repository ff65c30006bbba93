"""Tests of the blob stores: the shipped contract suite (`archive_manager.testing.blob_store`)
for every implementation, then filesystem specifics."""

from __future__ import annotations

import concurrent.futures
import errno
import multiprocessing
import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest
from _sharing import run_python

from archive_manager._util.digest import digest_of
from archive_manager._util.filemap import mapped
from archive_manager.blobs import BlobStore, IncompleteWrite, MemoryBlobStore, RetryingReads
from archive_manager.blobs import local as blobs
from archive_manager.errors import IntegrityError, InvalidNameError
from archive_manager.testing import FaultyBlobStore
from archive_manager.testing.blob_store import (
    BAD_DIGESTS,
    BlobStoreContract,
    ReadOnlyStoreContract,
)


def _damage_in_memory(store: MemoryBlobStore, digest: str, data: bytes) -> None:
    store._blobs[digest] = (data, store._blobs[digest][1])


def _damage_file(store: BlobStore, digest: str, data: bytes) -> None:
    path = store.path(digest)
    path.chmod(0o644)
    path.write_bytes(data)
    path.chmod(0o444)


def _leave_temp_file(store: BlobStore, digest: str) -> bool:
    """A temp file of ``digest`` as a writer killed mid-put leaves it."""
    (store.root / "tmp").mkdir(exist_ok=True)
    (store.root / "tmp" / f"{digest}.1.killed.tmp").write_bytes(b"half a blob")
    return True


def _files(store: BlobStore) -> dict[str, tuple[bytes, int, int]]:
    """Every file and folder under the store's root: bytes, mode and mtime (nanoseconds)."""
    found = {}
    for path in sorted(store.root.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() else b""
        found[str(path.relative_to(store.root))] = (data, st.st_mode, st.st_mtime_ns)
    return found


class TestMemoryBlobStore(BlobStoreContract, ReadOnlyStoreContract):
    @pytest.fixture
    def store(self) -> MemoryBlobStore:
        return MemoryBlobStore()

    def damage(self, store, digest, data) -> None:
        _damage_in_memory(store, digest, data)

    def test_temp_files_is_empty(self, store) -> None:
        store.put(b"x")
        assert store.temp_files() == []


class TestFaultyBlobStore(BlobStoreContract, ReadOnlyStoreContract):
    """The fault-injecting wrapper, with no fault planned, is a store like the one it wraps."""

    @pytest.fixture(params=["memory", "local"])
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> FaultyBlobStore:
        inner = MemoryBlobStore() if request.param == "memory" else BlobStore(tmp_path / "pool")
        return FaultyBlobStore(inner)

    def damage(self, store, digest, data) -> None:
        if isinstance(store.inner, MemoryBlobStore):
            _damage_in_memory(store.inner, digest, data)
        else:
            _damage_file(store.inner, digest, data)

    def leave_incomplete(self, store, digest) -> bool:
        return not isinstance(store.inner, MemoryBlobStore) and _leave_temp_file(
            store.inner, digest
        )


# The child: an atexit handler registered first reads a view over a blob's map, held to exit.
_READ_AT_EXIT = """
import atexit, sys
held = []
atexit.register(lambda: print("read at exit:", bytes(held[0][-4:]).hex(), flush=True))
from archive_manager._util.filemap import mapped
from archive_manager.blobs import BlobStore
from archive_manager.blobs import local
local._MAP_MIN = 1  # a map, however small
store = BlobStore(sys.argv[1])
held.append(store.open_private(store.put(b"0123456789" * 1000)))
print("mapped" if mapped(held[0].obj) else "read", flush=True)
"""


class TestBlobStore(BlobStoreContract, ReadOnlyStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> BlobStore:
        return BlobStore(tmp_path / "pool")

    def damage(self, store, digest, data) -> None:
        _damage_file(store, digest, data)

    def leave_incomplete(self, store, digest) -> bool:
        return _leave_temp_file(store, digest)

    def medium(self, store):
        return _files(store)

    def test_layout(self, store, tmp_path: Path) -> None:
        digest = store.put(b"where am I")
        expected = tmp_path / "pool" / "blobs" / digest[:2] / digest[2:4] / digest
        assert store.root == tmp_path / "pool"
        assert store.path(digest) == expected
        assert expected.read_bytes() == b"where am I"

    @pytest.mark.parametrize("fstype", ["nfs4", "fuse.juicefs", None])
    def test_a_root_not_known_local_is_read_as_copies(
        self, tmp_path: Path, monkeypatch, fstype: str | None
    ) -> None:
        """On a networked or FUSE root (or one whose filesystem is unknown), `get_view` and
        `open_private` copy: another host could change the file under a map, and a mount
        that vanishes faults a mapped read (SIGBUS) where a copy was read whole."""
        monkeypatch.setattr(blobs, "_MAP_MIN", 1)  # a map but for what is asked here
        monkeypatch.setattr(blobs, "read_mount_table", lambda: [])
        monkeypatch.setattr(blobs, "filesystem_type", lambda path, table: fstype)
        store = BlobStore(tmp_path / "pool")
        data = os.urandom(10_000)
        digest = store.put(data)
        for view in (store.get_view(digest), store.open_private(digest)):
            assert bytes(view) == data and not mapped(view.obj)
        assert store.get_view(digest).readonly

    @pytest.mark.parametrize("fstype", ["nfs4", "fuse.juicefs"])
    def test_a_blob_folder_mounted_from_the_network_is_read_as_copies(
        self, tmp_path: Path, monkeypatch, fstype: str
    ) -> None:
        """A root on the local disk (a SQLite catalog must be) with a networked or FUSE
        mount at ``blobs/``: its files are copied, not mapped, as on such a root (it mapped
        them: the root's filesystem was asked)."""
        monkeypatch.setattr(blobs, "_MAP_MIN", 1)  # a map but for what is asked here
        root = tmp_path / "pool"
        table = (blobs.read_mount_table() or "") + f"\nserver:/pool {root}/blobs {fstype} rw 0 0\n"
        monkeypatch.setattr(blobs, "read_mount_table", lambda: table)
        store = BlobStore(root)
        data = os.urandom(10_000)
        digest = store.put(data)
        for view in (store.get_view(digest), store.open_private(digest)):
            assert bytes(view) == data and not mapped(view.obj)

    @pytest.mark.parametrize("code", [errno.ENOMEM, errno.EMFILE, errno.ENODEV])
    def test_a_blob_that_cannot_be_mapped_is_read(
        self, tmp_path: Path, monkeypatch, code: int
    ) -> None:
        """A process at vm.max_map_count (ENOMEM: a replay buffer holding tensors over their
        maps), with no descriptor left for the one a map keeps, or on a filesystem that maps
        nothing: `get_view`, `open` and `open_private` read the bytes, as `get` does (chunks
        were read so before they were mapped), where they raised the map's OSError."""
        import mmap

        monkeypatch.setattr(blobs, "_MAP_MIN", 1)  # a map but for what is asked here
        store = BlobStore(tmp_path / "pool")
        data = os.urandom(10_000)
        digest = store.put(data)
        real = mmap.mmap

        def no_map(fd: int, length: int, *args: Any, **kwargs: Any) -> mmap.mmap:
            if fd >= 0:
                raise OSError(code, os.strerror(code))
            return real(fd, length, *args, **kwargs)

        def no_file_map(fd: int, *args: Any, **kwargs: Any) -> memoryview:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(mmap, "mmap", no_map)
        monkeypatch.setattr(blobs, "map_file", no_file_map)
        view, private, opened = (
            store.get_view(digest),
            store.open_private(digest),
            store.open(digest),
        )
        assert bytes(view) == bytes(private) == bytes(opened) == data
        assert view.readonly and opened.readonly and not private.readonly
        private[0] ^= 1  # its own copy
        assert store.get(digest) == data
        bad = data[:-1] + bytes([data[-1] ^ 1])
        _damage_file(store, digest, bad)
        for op in (store.get_view, store.open_private, store.open):
            with pytest.raises(IntegrityError, match=digest):
                op(digest)

    def test_maps_hold_no_descriptor_and_go_with_their_last_view(self, store, monkeypatch) -> None:
        """A tensor loaded from its blob lives on its map for as long as it is held (a
        replay buffer holds thousands): a map that kept a descriptor (Python's `mmap.mmap`
        does) made every open of the process fail at ``ulimit -n`` once a thousand were
        held.  The map itself goes when the last view over it does."""
        import gc

        monkeypatch.setattr(blobs, "_MAP_MIN", 1)  # every blob mapped
        data = os.urandom(10_000)
        digest = store.put(data)
        path = str(store.path(digest))

        def maps_of_the_blob() -> int:
            with open("/proc/self/maps") as f:
                return sum(line.rstrip().endswith(path) for line in f)

        fds = len(os.listdir("/proc/self/fd"))
        views = [store.open_private(digest) for _ in range(50)]
        views += [store.get_view(digest) for _ in range(50)]
        views += [store.open(digest) for _ in range(50)]
        assert all(mapped(v.obj) and bytes(v) == data for v in views)
        assert len(os.listdir("/proc/self/fd")) == fds
        assert maps_of_the_blob() == 150
        del views
        gc.collect()
        assert maps_of_the_blob() == 0

    def test_a_map_held_at_exit_is_read_by_atexit_handlers(self, tmp_path: Path) -> None:
        """A view over a map held until the interpreter exits, read by an atexit handler
        registered before the first map (a replay buffer saved on exit): the read sees the
        bytes (the map's finalizer unmapped it at exit, ahead of the handler: SIGSEGV)."""
        done = run_python(_READ_AT_EXIT, str(tmp_path / "pool"))
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert done.stdout.split() == ["mapped", "read", "at", "exit:", b"6789".hex()]

    def test_a_read_only_map_of_a_blob_larger_than_memory_is_made(self, store) -> None:
        """A read-only open of a blob larger than RAM plus swap (a sparse file) is a map, as
        Python's read-only map was: the private map, writable for its owner's sake, was
        charged in full to the memory commit, refused (ENOMEM) under the default overcommit
        heuristic, and the store read the whole file instead (MemoryError)."""
        from archive_manager._util import filemap

        with open("/proc/sys/vm/overcommit_memory") as f:
            if f.read().strip() != "0" or not filemap._MAP_NORESERVE:
                pytest.skip("the overcommit heuristic (mode 0) and MAP_NORESERVE's value")
        with open("/proc/meminfo") as f:
            mem = {line.split(":")[0]: int(line.split()[1]) << 10 for line in f}
        size = mem["MemTotal"] + mem["SwapTotal"] + (8 << 30)
        store.put(b"the layout")
        digest = "0" * 32  # a sparse file in a blob's place: its digest is not checked
        path = store.path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.seek(size - 1)
            f.write(b"Z")
        view = store.open(digest, verify=False)
        assert mapped(view.obj) and view.readonly and len(view) == size
        assert view[-1] == ord("Z")

    def test_a_map_is_private(self, store, monkeypatch) -> None:
        """A write through a read-only view's owner (which Python lets a caller reach) lands
        in the process's own page, never in the blob file."""
        monkeypatch.setattr(blobs, "_MAP_MIN", 1)
        data = os.urandom(10_000)
        digest = store.put(data)
        view = store.get_view(digest)
        owner = view.obj
        owner[0] = bytes([data[0] ^ 0xFF])
        assert view[0] == data[0] ^ 0xFF
        assert store.path(digest).read_bytes() == data == bytes(store.get_view(digest))

    def test_relative_root_is_made_absolute(self, tmp_path: Path, monkeypatch) -> None:
        monkeypatch.chdir(tmp_path)
        store = BlobStore("pool/../pool")
        assert store.root == tmp_path / "pool"

    @pytest.mark.parametrize("bad", BAD_DIGESTS, ids=repr)
    def test_path_refuses_invalid_digest(self, store, bad) -> None:
        with pytest.raises(InvalidNameError):
            store.path(bad)

    def test_blob_is_read_only_and_no_temp_file_remains(self, store) -> None:
        digest = store.put([b"read", b"only"])
        assert stat.S_IMODE(store.path(digest).stat().st_mode) == 0o444
        assert store.temp_files() == []
        assert list((store.root / "tmp").iterdir()) == []

    def test_put_of_existing_blob_does_not_rewrite_it(self, store) -> None:
        digest = store.put(b"written once")
        path = store.path(digest)
        os.utime(path, (1_000_000, 1_000_000))
        inode = path.stat().st_ino
        assert store.put(b"written once") == digest
        assert path.stat().st_mtime == 1_000_000
        assert path.stat().st_ino == inode

    def test_large_blob_spans_several_write_blocks(self, store) -> None:
        data = random.Random(7).randbytes(2 * blobs._BLOCK + 12345)
        head = b"tensor header"
        digest = store.put([head, memoryview(data)])
        assert digest == digest_of(head + data)
        store.check(digest)
        assert store.open(digest)[len(head) : len(head) + 64] == data[:64]

    def test_stray_files_are_not_iterated(self, store) -> None:
        real = store.put(b"the real blob")
        other = digest_of(b"a stray")
        blobs_dir = store.root / "blobs"
        strays = [
            blobs_dir / "zz" / "readme.txt",
            blobs_dir / other,
            blobs_dir / other[:2] / other,
            blobs_dir / "00" / "00" / (other if not other.startswith("0000") else real),
            blobs_dir / real[:2] / real[2:4] / f"{other}.1234.abcdef.tmp",
            blobs_dir / real[:2] / real[2:4] / other.upper(),
            blobs_dir / other[:2].upper() / other[2:4] / other,
            blobs_dir / other[:2] / other[2:4] / (other + ".bak"),
            store.root / "tmp" / other,
        ]
        for path in strays:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"stray")
        # A directory and a symlink bearing a canonical name in the right place are not blobs.
        dir_named = digest_of(b"a directory")
        store.path(dir_named).mkdir(parents=True)
        link_named = digest_of(b"a symlink")
        store.path(link_named).parent.mkdir(parents=True, exist_ok=True)
        store.path(link_named).symlink_to(strays[0])
        assert list(store.iter_digests()) == [real]
        assert [(d, size) for d, size, _ in store.iter_stat()] == [(real, 13)]

    def test_empty_pool_iterates_nothing(self, tmp_path: Path) -> None:
        store = BlobStore(tmp_path / "not yet created")
        assert list(store) == []
        assert list(store.iter_stat()) == []
        assert store.temp_files() == []

    def test_temp_files_and_remove_temp(self, store) -> None:
        store.put(b"makes the folders")
        leftover = store.root / "tmp" / "deadbeef.1.abc.tmp"
        leftover.write_bytes(b"half a blob")
        os.utime(leftover, (2_000_000, 2_000_000))
        assert store.temp_files() == [(leftover, 2_000_000.0)]
        assert store.remove_temp(leftover) is True
        assert not leftover.exists()
        assert store.remove_temp(leftover) is False
        assert store.temp_files() == []

    def test_temp_files_are_the_incomplete_writes_and_are_swept_by_age(self, store) -> None:
        store.put(b"makes the folders")
        tmp = store.root / "tmp"
        old, young = tmp / "dead.1.abc.tmp", tmp / "live.2.def.tmp"
        for path, mtime in ((old, 2_000_000), (young, 3_000_000)):
            path.write_bytes(b"half a blob")
            os.utime(path, (mtime, mtime))
        (tmp / "notes.txt").write_bytes(b"an operator's")
        assert sorted(store.incomplete_writes(), key=lambda w: w.mtime) == [
            IncompleteWrite(old.name, 2_000_000.0),
            IncompleteWrite(young.name, 3_000_000.0),
        ]
        assert store.sweep_incomplete(1_000_000) == 0
        assert store.sweep_incomplete(2_500_000) == 1
        assert not old.exists() and young.exists() and (tmp / "notes.txt").exists()
        assert store.remove_incomplete(IncompleteWrite(young.name, 0.0)) is True
        assert store.incomplete_writes() == []

    def test_remove_temp_refuses_paths_outside_tmp(self, store) -> None:
        digest = store.put(b"precious")
        (store.root / "tmp" / "sub").mkdir()
        inner = store.root / "tmp" / "sub" / "file"
        inner.write_bytes(b"nested")
        outside = [
            store.path(digest),
            store.root / "tmp" / ".." / "blobs" / digest[:2] / digest[2:4] / digest,
            inner,
            store.root / "tmp",
            store.root / "catalog.sqlite",
        ]
        for path in outside:
            with pytest.raises(InvalidNameError):
                store.remove_temp(path)
        assert store.get(digest) == b"precious"
        assert inner.exists()

    def test_write_failure_midway_leaves_nothing(self, store, monkeypatch) -> None:
        calls = []
        real_write_all = blobs._write_all

        def failing_write_all(fd: int, view: memoryview) -> None:
            calls.append(len(view))
            if len(calls) == 1:
                real_write_all(fd, view)
                return
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(blobs, "_write_all", failing_write_all)
        data = [b"a" * 100, b"b" * 100]
        with pytest.raises(OSError) as info:
            store.put(data)
        assert info.value.errno == errno.ENOSPC
        assert len(calls) == 2  # the failure came after bytes were written to the temp file
        assert store.temp_files() == []
        assert not store.has(digest_of(b"".join(data)))
        assert list(store.iter_digests()) == []

    def test_interrupt_midway_leaves_nothing(self, store, monkeypatch) -> None:
        def interrupted(fd: int, view: memoryview) -> None:
            os.write(fd, view[:10])
            raise KeyboardInterrupt

        monkeypatch.setattr(blobs, "_write_all", interrupted)
        with pytest.raises(KeyboardInterrupt):
            store.put(b"x" * 100)
        assert store.temp_files() == []
        assert list(store.iter_digests()) == []

    def test_rename_failure_leaves_nothing(self, store, monkeypatch) -> None:
        def read_only_fs(src, dst) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(blobs.os, "rename", read_only_fs)
        with pytest.raises(OSError) as info:
            store.put(b"never lands")
        assert info.value.errno == errno.EROFS
        assert store.temp_files() == []
        assert not store.has(digest_of(b"never lands"))

    def test_buffer_mutated_after_hashing_is_caught(self, store, monkeypatch) -> None:
        tensor = bytearray(b"q" * 64)
        real_write_all = blobs._write_all

        def scribble_then_write(fd: int, view: memoryview) -> None:
            tensor[0] ^= 1  # another thread writes to the tensor after put() hashed it
            real_write_all(fd, view)

        monkeypatch.setattr(blobs, "_write_all", scribble_then_write)
        with pytest.raises(IntegrityError, match="changed while"):
            store.put([b"header", tensor])
        assert store.temp_files() == []
        assert list(store.iter_digests()) == []

    @staticmethod
    def _open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def test_an_existing_blob_has_its_folder_synced(self, store, monkeypatch) -> None:
        # Another writer may have renamed it in and not yet synced the folder: a save that
        # publishes it must not return before the name is durable.
        first, second = store.put(b"one"), store.put(b"two")
        synced: list[Path] = []
        real = blobs._fsync_dir

        def fsync_dir(path: Path) -> None:
            synced.append(path)
            real(path)

        monkeypatch.setattr(blobs, "_fsync_dir", fsync_dir)
        store.put(b"one")
        assert synced == [store.path(first).parent]
        synced.clear()
        store.put_many([(b"one", None), (b"two", None), (b"three", None)])
        folders = {store.path(d).parent for d in (first, second, digest_of(b"three"))}
        assert folders <= set(synced)

    def test_a_few_small_blobs_are_synced_together(self, store, monkeypatch) -> None:
        """A small save's chunk and manifest (`put_new` of a few small blobs): their temp
        files are synced at the same time, then every folder that gained an entry, as
        fsyncs made together cost the disk one flush where made in turn they cost one each
        (docs/architecture/blob-store-contract.md).  Each fsync waits (10 s at most) for a
        second one of its kind to begin: only fsyncs made together overlap."""
        import threading

        cond = threading.Condition()
        started = {"file": 0, "folder": 0}
        running = {"file": 0, "folder": 0}
        most = {"file": 0, "folder": 0}
        fsync = os.fsync

        def watched(fd: int) -> None:
            kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            with cond:
                started[kind] += 1
                running[kind] += 1
                most[kind] = max(most[kind], running[kind])
                cond.notify_all()
                cond.wait_for(lambda: started[kind] >= 2, timeout=10)
            try:
                fsync(fd)
            finally:
                with cond:
                    running[kind] -= 1

        store.put(b"an earlier blob")  # tmp/ made (and its folder synced) before
        items = [(b"a chunk" * 100, None), (b"its manifest", None)]
        monkeypatch.setattr(os, "fsync", watched)
        digests = store.put_new(items)
        monkeypatch.undo()
        assert most == {"file": 2, "folder": most["folder"]} and most["folder"] >= 2
        assert [store.get(d) for d in digests] == [data for data, _ in items]
        assert store.temp_files() == []

    def test_put_many_past_one_batch(self, store, monkeypatch) -> None:
        kicked: list[int] = []
        monkeypatch.setattr(blobs, "_start_writeback", lambda fd: kicked.append(fd))
        old = store.put(b"already here")
        before = os.stat(store.path(old)).st_ino
        items = [(os.urandom(200 + i), None) for i in range(2 * blobs._BATCH + 7)]
        items[blobs._BATCH + 3] = (b"already here", None)
        items.append(items[3])
        digests = store.put_many(items)
        assert digests == [digest_of(data) for data, _ in items]
        assert all(store.get(d) == data for (data, _), d in zip(items, digests, strict=True))
        assert os.stat(store.path(old)).st_ino == before  # an existing blob is not rewritten
        # Every new file's writeback was started before its fsync (the duplicate twice).
        assert len(kicked) == len(items) - 1
        assert store.temp_files() == []

    def test_put_many_works_without_the_writeback_hint(self, store, monkeypatch) -> None:
        monkeypatch.setattr(blobs, "_SYNC_FILE_RANGE", lambda *args: -1)  # fails: ignored
        items = [(os.urandom(300), None) for _ in range(5)]
        assert [store.get(d) for d in store.put_many(items)] == [d for d, _ in items]
        monkeypatch.setattr(blobs, "_SYNC_FILE_RANGE", None)  # not Linux
        items = [(os.urandom(300), None) for _ in range(5)]
        assert [store.get(d) for d in store.put_many(items)] == [d for d, _ in items]

    @pytest.mark.parametrize("phase", ["write", "fsync"])
    def test_put_many_failure_leaves_no_temp_file_or_descriptor(
        self, store, monkeypatch, phase
    ) -> None:
        items = [(bytes([i]) * (1000 + i), None) for i in range(blobs._BATCH + 10)]
        victim = blobs._BATCH + 5  # in the second batch: the first one is already durable
        if phase == "write":
            real_write_all = blobs._write_all

            def write_all(fd: int, view: memoryview) -> None:
                if bytes(view[:1]) == bytes([victim]):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                real_write_all(fd, view)

            monkeypatch.setattr(blobs, "_write_all", write_all)
        else:
            real_fsync = os.fsync
            victim_fds: set[int] = set()
            real_begin = store._begin

            def begin(digest: str, views: list) -> object:
                pending = real_begin(digest, views)
                if bytes(views[0][:1]) == bytes([victim]):
                    victim_fds.add(pending.fd)
                return pending

            def fsync(fd: int) -> None:
                if fd in victim_fds:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                real_fsync(fd)

            monkeypatch.setattr(store, "_begin", begin)
            monkeypatch.setattr(blobs.os, "fsync", fsync)
        fds = self._open_fds()
        with pytest.raises(OSError) as info:
            store.put_many(items)
        assert info.value.errno == (errno.ENOSPC if phase == "write" else errno.EIO)
        assert self._open_fds() == fds
        assert store.temp_files() == []
        stored = set(store.iter_digests())
        assert digest_of(items[victim][0]) not in stored
        # The first batch landed whole; whatever else landed is intact.
        assert {digest_of(d) for d, _ in items[: blobs._BATCH]} <= stored
        for digest in stored:
            store.check(digest)

    def test_put_many_interrupted_leaves_no_temp_file_or_descriptor(
        self, store, monkeypatch
    ) -> None:
        # The caller's thread is interrupted while the batch is being staged (KeyboardInterrupt
        # arrives in the thread that waits); the staged temp files must not outlive the call.
        real_first_failure = blobs._first_failure
        calls = []

        def interrupted(futures: list[Any]) -> BaseException | None:

            calls.append(len(futures))
            if len(calls) == 3:  # second batch, staging
                concurrent.futures.wait(futures)
                raise KeyboardInterrupt
            return real_first_failure(futures)

        monkeypatch.setattr(blobs, "_first_failure", interrupted)
        items = [(os.urandom(500), None) for _ in range(2 * blobs._BATCH)]
        fds = self._open_fds()
        with pytest.raises(KeyboardInterrupt):
            store.put_many(items)
        assert self._open_fds() == fds
        assert store.temp_files() == []
        stored = set(store.iter_digests())
        assert stored == {digest_of(d) for d, _ in items[: blobs._BATCH]}

    @staticmethod
    def _fail_nth_begin(store: BlobStore, monkeypatch, n: int, err: int) -> None:
        """Make the ``n``-th temp file that ``store`` starts fail with ``err``."""
        real_begin = store._begin
        begun: list[int] = []

        def begin(digest: str, views: list) -> object:
            begun.append(1)
            if len(begun) == n:
                raise OSError(err, os.strerror(err))
            return real_begin(digest, views)

        monkeypatch.setattr(store, "_begin", begin)

    def test_put_many_out_of_descriptors_writes_one_at_a_time(self, store, monkeypatch) -> None:
        self._fail_nth_begin(store, monkeypatch, 5, errno.EMFILE)
        items = [(os.urandom(400), None) for _ in range(blobs._BATCH + 3)]
        fds = self._open_fds()
        digests = store.put_many(items)
        assert digests == [digest_of(d) for d, _ in items]
        assert all(store.get(d) == data for (data, _), d in zip(items, digests, strict=True))
        assert self._open_fds() == fds and store.temp_files() == []

    def test_put_many_reports_the_failure_not_the_cleanup(self, store, monkeypatch) -> None:
        self._fail_nth_begin(store, monkeypatch, 6, errno.ENOSPC)

        def unlink(path: object) -> None:  # the filesystem turned read-only meanwhile
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        items = [(os.urandom(400), None) for _ in range(blobs._BATCH)]
        fds = self._open_fds()
        monkeypatch.setattr(blobs.os, "unlink", unlink)
        with pytest.raises(OSError) as info:
            store.put_many(items)
        monkeypatch.undo()
        assert info.value.errno == errno.ENOSPC
        assert self._open_fds() == fds  # every descriptor closed, though no file could go
        assert list(store.iter_digests()) == []

    def test_concurrent_puts_from_processes(self, store) -> None:
        size = blobs._BLOCK + 4321
        expected = _payload(size)
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(4)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_put_worker, args=(str(store.root), size, barrier, results))
            for _ in range(4)
        ]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
        assert outcomes == [("ok", digest_of(expected))] * 4
        digest = digest_of(expected)
        assert list(store.iter_digests()) == [digest]
        assert store.get(digest) == expected
        assert stat.S_IMODE(store.path(digest).stat().st_mode) == 0o444
        assert store.temp_files() == []


class TestRetryingReads(BlobStoreContract, ReadOnlyStoreContract):
    """The read retry wrapper around the filesystem store (what a pool on a folder uses) is a
    store like the one it wraps; a damaged blob is reported once the (short) bound passed."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> RetryingReads:
        return RetryingReads(BlobStore(tmp_path / "pool"), 0.05)

    def damage(self, store, digest, data) -> None:
        _damage_file(store.inner, digest, data)

    def leave_incomplete(self, store, digest) -> bool:
        return _leave_temp_file(store.inner, digest)

    def medium(self, store):
        return _files(store.inner)


def _payload(size: int) -> bytes:
    return random.Random(1234).randbytes(size)


def _put_worker(root: str, size: int, barrier, results) -> None:
    data = _payload(size)
    barrier.wait(timeout=60)
    try:
        results.put(("ok", BlobStore(root).put(data)))
    except BaseException as exc:
        results.put(("error", repr(exc)))


def test_a_store_written_before_put_new_still_saves(tmp_path: Path) -> None:
    """A store whose `put_many` predates ``workers`` (a save called it with the items only)
    still takes a save: `put_new`'s default calls it the same way."""
    from archive_manager import ArchiveManager
    from archive_manager.interop.synthetic import make_rollout

    calls: list[int] = []

    class OldStore(BlobStore):
        def put_many(self, items):  # type: ignore[no-untyped-def, override]
            calls.append(len(items))
            return super().put_many(items)

    samples: list[Any] = make_rollout(40, seed=5)
    root = tmp_path / "pool"
    with ArchiveManager.open(root, store=OldStore(root), chunk_size=16) as pool:
        archive = pool.save("a", samples, rollout_id=1)
        assert [s.tokens for s in archive.load_samples()] == [s.tokens for s in samples]
        assert pool.verify(read_data=True).ok
    assert sum(calls) >= 4  # three chunks and the manifest went through it
