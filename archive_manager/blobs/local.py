"""The filesystem blob store: immutable files named by the xxh3-128 digest of their bytes
(docs/architecture/blob-store-contract.md, "Blob store contract").

A blob lives at ``<root>/blobs/<d[0:2]>/<d[2:4]>/<d>`` (`layout`); writes go through
``<root>/tmp``.  The store knows nothing of the catalog: it writes, reads, verifies, lists
and unlinks files.

OS errors other than "not found" (EACCES, ENOSPC, EROFS, ...) propagate unchanged as `OSError`;
a failed `LocalBlobStore.put` leaves neither a temp file nor a blob behind.

Nothing is read, written, listed or unlinked through a symlink, which could lead out of the
pool (``tmp/`` linked to a shared scratch folder would have GC sweep that folder):

* the folders of the pool, ``blobs/``, ``tmp/`` and the fan-out folders ``blobs/ab/`` and
  ``blobs/ab/cd/``, must be real directories.  Each is looked at (``lstat``) whenever it is
  used, and one that is a symlink makes the operation raise `PoolLayoutError` (an `OSError`)
  before it touches anything, so GC stops with `GcAbortedError`.  The root itself may be a
  symlink: to keep a pool on another disk, link its root, not its folders.  (A process that
  swaps a folder for a link while the pool is in use is not defended against.)
* a blob is read only from a regular file: its path is opened without following a symlink
  and without blocking (a FIFO would block a plain open), then checked with ``fstat``; a
  symlink, FIFO, device, socket or directory there is a `BlobCorruptError` naming the blob.
  `delete` unlinks whatever non-directory is at the blob's path (a symlink itself, never its
  target); listings and the temp sweep see regular files only.

Every read opens the blob's path afresh (no descriptor is kept between calls), so that a read
tried again after a stale metadata cache showed it missing or old sees the file now there: a
pool on a folder gets its store as `local_pool_store`, this store behind
`blobs.retry.RetryingReads` with the bound that follows the root's filesystem
(`resolve_read_retry`; docs/architecture/shared-pools.md, "Shared pools").
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import functools
import mmap
import os
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from .._util.atomic import fsync_dir, in_parallel
from .._util.digest import Buffer, check_digest, is_digest
from .._util.failpoints import failpoint
from .._util.filemap import map_file
from .._util.mounts import filesystem_type, is_network_filesystem, read_mount_table
from .._util.permissions import share_like_parent
from .._util.threads import Helpers
from ..errors import (
    BlobCorruptError,
    BlobNotFoundError,
    BlobStoreError,
    IntegrityError,
    InvalidInputError,
    InvalidNameError,
    PoolLayoutError,
    PoolRootMissingError,
)
from ._common import check_size as _check_size
from ._common import corrupt as _corrupt
from ._common import missing as _missing
from ._common import prepare as _prepare
from ._common import verify as _verify
from ._common import views_of
from .base import AbstractBlobStore, BlobStat, Capabilities, IncompleteWrite, PutItem
from .layout import BLOBS_DIR, FANOUT_NAMES, TEMP_DIR, fanout, is_blob_name
from .retry import RetryingReads, check_seconds

__all__ = [
    "DEFAULT_SHARED_READ_RETRY",
    "READ_RETRY_ENV",
    "BlobStore",
    "LocalBlobStore",
    "local_pool_store",
    "resolve_read_retry",
]

#: Seconds a read of a missing or mismatching blob keeps trying on a networked or FUSE root.
#: JuiceFS keeps attributes and entries 1 s by default and NFS its file attributes 3-60 s
#: (``acregmin``/``acregmax``); 5 s covers JuiceFS's caches with room for a loaded client
#: (a blob another host had just rewritten read after 1.1 s, tests/pool/test_two_hosts.py), and
#: keeps a truly missing or corrupt blob's error seconds away, not a minute.  NFS's cached negative lookups
#: may last longer (``acdirmax``, 60 s): mount with ``lookupcache=positive`` or raise this.
DEFAULT_SHARED_READ_RETRY = 5.0
#: The variable that sets the bound for every store that is not given one (seconds, >= 0).
READ_RETRY_ENV = "ARCHIVE_MANAGER_BLOB_READ_RETRY"

# Read/write/hash granularity: large enough for full disk throughput, small enough for memory.
_BLOCK = 8 << 20
# Blobs `put_many` writes before it syncs them: bounds open files and dirty pages in flight.
_BATCH = 16
# Up to this many bytes in all, `put_many` writes on the calling thread (`_put_inline`).
_INLINE_BYTES = 1 << 20
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
# A map that cannot be made where a read can: the process's maps at vm.max_map_count (or its
# address space at RLIMIT_AS), no descriptor left for the one a map keeps (Python's mmap holds
# a duplicate), a filesystem that does not map files.  `_mapped` reads the bytes instead.
_CANNOT_MAP = (errno.ENOMEM, *_OUT_OF_FDS, errno.ENODEV)
_MISSING = (FileNotFoundError, NotADirectoryError)
# `get_view` and `open_private` read a blob smaller than this instead of mapping it: reading
# 256 KiB took 23 us against 34 us for a map and its page faults, 4 MiB 487 us against
# 248 us (medians of 30 and 9), and every map is one of a process's vm.max_map_count.
_MAP_MIN = 2 << 20
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
# Every temp file a put makes ends so; the sweep leaves anything else in tmp/ alone.
_TEMP_SUFFIX = ".tmp"
_KINDS = {
    stat.S_IFLNK: "symlink",
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def _not_regular(digest: str, path: str | Path, mode: int) -> BlobCorruptError:
    kind = _KINDS.get(stat.S_IFMT(mode), "file of unknown type")
    return BlobCorruptError(f"blob {digest} is not a regular file: {path} is a {kind}")


def _linked_folder(folder: Path | str, digest: str | None = None) -> PoolLayoutError:
    return PoolLayoutError(
        ("" if digest is None else f"blob {digest}: ")
        + f"{folder} is a symlink; the pool's folders must be real directories (to keep a "
        "pool on another disk, link its root instead)"
    )


def _check_folders(folders: Sequence[str | Path], digest: str | None = None) -> None:
    """PoolLayoutError if one of ``folders`` (outermost first) is a symlink.

    Stops at the first one missing: nothing below it exists to lead anywhere.
    """
    for folder in folders:
        try:
            mode = os.lstat(folder).st_mode
        except _MISSING:
            return
        if stat.S_ISLNK(mode):
            raise _linked_folder(folder, digest)


def _subfolders(entries: Iterable[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
    """The fan-out folders (two hex digits, real directories) among ``entries``.

    PoolLayoutError for one that is a symlink; a stray file bearing such a name is skipped.
    """
    for entry in entries:
        if entry.name not in FANOUT_NAMES:
            continue
        if entry.is_symlink():
            raise _linked_folder(entry.path)
        if entry.is_dir(follow_symlinks=False):
            yield entry


def _write_all(fd: int, view: memoryview) -> None:
    """Write all of ``view`` to ``fd``; tests monkeypatch this to inject ENOSPC and the like."""
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    # A new directory entry (rename, mkdir) survives a power loss only once its directory is
    # synced; an error other than "cannot sync a folder here" (some network filesystems) is
    # the medium's and is raised.  A seam of its own: tests count the folder syncs.
    fsync_dir(path, strict=True)


@dataclass(frozen=True)
class _Pending:
    """A blob's temp file, written and read-only, not yet synced or renamed."""

    fd: int
    tmp: Path
    target: Path


def _fsync_dirs(folders: Iterable[Path]) -> None:
    """`_fsync_dir` of each of ``folders``, all at once (`in_parallel`)."""
    in_parallel([functools.partial(_fsync_dir, folder) for folder in sorted(folders)])


def _unlink_temp(pending: _Pending) -> None:
    """Remove the temp file of ``pending``, whose descriptor is closed already."""
    with contextlib.suppress(OSError):
        os.unlink(pending.tmp)


def _abandon(pending: _Pending) -> None:
    with contextlib.suppress(OSError):
        os.close(pending.fd)
    # Any error: a temp file left behind is swept by GC's temp cleanup; the caller must see
    # the failure that made us abandon, not this one.
    with contextlib.suppress(OSError):
        os.unlink(pending.tmp)


def _total_bytes(items: Sequence[PutItem]) -> int:
    return sum(view.nbytes for data, _ in items for view in views_of(data))


def _first_failure(futures: list[concurrent.futures.Future[Any]]) -> BaseException | None:
    concurrent.futures.wait(futures)
    return next((f.exception() for f in futures if f.exception() is not None), None)


def _map_or_read(fd: int, size: int, path: str, access: int) -> memoryview:
    """A private map of the file ``fd`` (``size`` > 0 bytes, at ``path``), read-only for
    ``mmap.ACCESS_READ``, else writable; where none can be made (`_CANNOT_MAP`), its bytes
    read as `get` reads them: read-only, or for a private map a writable copy.

    NOTE: each map a process holds is one of its vm.max_map_count (65,530): a process at the
    limit read chunks into bytes before they were mapped, and must still read them.  Maps
    hold no descriptor (`filemap.map_file`; Python's `mmap.mmap`, kept where libc's cannot
    be called, holds one for as long as it lives: 1,000 tensors held over their blobs held
    1,000 descriptors, and at ``ulimit -n`` 1024 every open of the process failed).
    """
    try:
        view = map_file(fd, size, path, writable=access != mmap.ACCESS_READ)
        return memoryview(mmap.mmap(fd, 0, access=access)) if view is None else view
    except OSError as exc:
        if exc.errno not in _CANNOT_MAP:
            raise
    return _read_fd(fd, access)


def _read_fd(fd: int, access: int) -> memoryview:
    """The bytes of the file ``fd`` as `get` reads them: read-only for ``mmap.ACCESS_READ``,
    else a writable copy of the caller's own."""
    with open(fd, "rb", closefd=False) as f:
        data = f.read()
    return memoryview(data if access == mmap.ACCESS_READ else bytearray(data))


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None  # elsewhere fsync alone does it
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the dirty pages; do not wait


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now (a hint; fsync still decides).

    NOTE: without it the kernel leaves fresh pages dirty until the fsync, and a few fsyncs at
    a time keep the disk's queue shallow.  A failure (a filesystem without it) is ignored.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _read_retry_from_env() -> float | None:
    """``$ARCHIVE_MANAGER_BLOB_READ_RETRY`` in seconds, or None when it is unset or empty.

    Raises:
        InvalidInputError: the variable is set to anything but a number of seconds >= 0.
    """
    raw = os.environ.get(READ_RETRY_ENV, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise InvalidInputError(
            f"{READ_RETRY_ENV} must be a number of seconds, not {raw!r}"
        ) from None
    return check_seconds(seconds, READ_RETRY_ENV)


def resolve_read_retry(root: str | os.PathLike[str], value: float | None = None) -> float:
    """How long a read of a blob under ``root`` keeps trying (seconds;
    docs/architecture/shared-pools.md, "Shared pools"): ``value``, else
    ``$ARCHIVE_MANAGER_BLOB_READ_RETRY``, else `DEFAULT_SHARED_READ_RETRY` when ``root`` is on a
    networked or FUSE filesystem and 0 on a local one, whose one kernel's caches are never stale (a
    blob missing there is missing).

    Raises:
        InvalidInputError: the value (or the variable) is not a number of seconds >= 0.
    """
    if value is not None:
        return check_seconds(value, "read_retry")
    seconds = _read_retry_from_env()
    if seconds is not None:
        return seconds
    table = read_mount_table()
    if table is None:
        return 0.0
    fstype = filesystem_type(os.path.realpath(root), table)
    if fstype is not None and is_network_filesystem(fstype):
        return DEFAULT_SHARED_READ_RETRY
    return 0.0


def local_pool_store(
    root: str | os.PathLike[str], *, read_retry: float | None = None
) -> RetryingReads:
    """The store of a pool on the folder ``root``: a `LocalBlobStore` whose reads are tried
    again (`RetryingReads`) for ``read_retry`` seconds, by default `resolve_read_retry`'s: 5 s
    on a networked or FUSE root, 0 on a local disk, decided at the first read that needs it
    (the mount table is read then, never on the common read).
    ``$ARCHIVE_MANAGER_BLOB_READ_RETRY`` is read now.

    Raises:
        InvalidInputError: ``read_retry`` or the variable is not a number of seconds >= 0.
    """
    # NOTE: checked now, a bad value (given or in the variable) is refused when the pool opens:
    # found at the first read that needed a retry, it replaced that read's BlobNotFoundError
    # or IntegrityError and stopped `verify` (docs/architecture/shared-pools.md, "Shared pools").
    seconds = (
        _read_retry_from_env() if read_retry is None else check_seconds(read_retry, "read_retry")
    )
    store = LocalBlobStore(root)
    if seconds is not None:
        return RetryingReads(store, seconds)
    return RetryingReads(store, functools.partial(resolve_read_retry, store.root))


class LocalBlobStore(AbstractBlobStore):
    """Blobs on a (possibly shared) POSIX filesystem under ``root``; folders are made lazily.

    Its reads are not tried again: on a shared filesystem use `local_pool_store` (what a pool
    on a folder uses), or wrap it in `RetryingReads`.
    """

    capabilities = Capabilities(mmap=True, local_paths=True, persistent=True)
    read_extras = frozenset({"root", "path", "temp_files"})

    def __init__(self, root: str | os.PathLike[str]) -> None:
        # Absolute and normalised, so a later chdir cannot move the store and `remove_temp`
        # can compare paths textually.
        self._root = Path(os.path.abspath(root))
        self._blobs = self._root / BLOBS_DIR
        self._blobs_str = str(self._blobs)
        self._tmp = self._root / TEMP_DIR
        # The root, blobs/ and tmp/ once seen (here, or made or used by a put): a store
        # never makes one of them again (`_make_folder`).
        self._seen = {f for f in (self._root, self._blobs, self._tmp) if f.is_dir()}
        self._private_maps: bool | None = None  # `_maps_privately`, decided at first use

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._root)!r})"

    @property
    def root(self) -> Path:
        """The pool root holding ``blobs/`` and ``tmp/``."""
        return self._root

    def _make_folder(self, folder: Path, unsynced: set[Path] | None = None) -> None:
        """Create ``folder`` (``tmp/`` or a fan-out folder) and its missing parents below the
        root, syncing each parent that gains an entry (or, with ``unsynced``, adding it there
        for the caller to sync before it reports the blob durable).

        NOTE: never the root, ``blobs/`` or ``tmp/`` once this store has seen it: one missing
        now went away with its pool (moved, deleted, a mount gone and its empty mount point
        left at the path), and a put that made it again wrote a phantom pool there, whose
        blobs the catalog then published (docs/architecture/pool-identity.md, "Pool identity").  (A
        store of a folder not made yet, used on its own, makes it at its first put; a pool's
        open makes the root of a new pool.)

        Raises:
            PoolRootMissingError: the root, ``blobs/`` or ``tmp/`` is gone since it was seen.
        """
        if folder.is_dir():
            return
        if folder in self._seen:
            if folder.is_dir():
                return  # another thread of this store made it between the two looks
            raise PoolRootMissingError(
                f"{folder} is gone since this store saw it (the pool at {self._root} moved, "
                "was deleted, or its mount went away?): nothing was written, and it is not "
                "made again, so that no blob goes outside the pool; reopen the pool where it "
                "is now"
            )
        self._make_folder(folder.parent, unsynced)
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        else:
            share_like_parent(folder)  # a group-shared pool stays shared (permissions.py)
        # Synced even if a concurrent writer made it: ours may be the rename that depends on it.
        if unsynced is None:
            _fsync_dir(folder.parent)
        else:
            unsynced.add(folder.parent)

    def path(self, digest: str) -> Path:
        """The file of ``digest``; InvalidNameError unless it is a canonical digest."""
        d = check_digest(digest)
        outer, inner = fanout(d)
        return self._blobs / outer / inner / d

    def _checked_path(self, digest: str) -> str:
        """`path` as a string, after checking that none of its folders is a symlink
        (PoolLayoutError)."""
        d = check_digest(digest)
        a, b = fanout(d)
        # Strings, not Paths: building Paths cost more than the three lstat calls.
        outer = f"{self._blobs_str}{os.sep}{a}"
        inner = f"{outer}{os.sep}{b}"
        _check_folders((self._blobs_str, outer, inner), d)
        return f"{inner}{os.sep}{d}"

    def put(self, data: Buffer | Sequence[Buffer], digest: str | None = None) -> str:
        """Store ``data`` (a buffer or a sequence of parts) once and return its digest.

        An existing blob is not rewritten, only its size is compared with the data's; its
        folder is synced, since another writer may have renamed it in and not yet synced it.

        Raises:
            IntegrityError: ``digest`` is not the data's digest (`BlobCorruptError`: the
                stored blob's size differs, or no regular file is in its place).
            InvalidNameError: ``digest`` is not canonical.
            OSError: the write failed (ENOSPC, EROFS, ...); no temp file or blob is left.
        """
        digest, pending = self._stage(data, digest)
        if pending is not None:
            self._finish(pending)
        else:
            _fsync_dir(self.path(digest).parent)
        return digest

    def put_many(self, items: Sequence[PutItem], *, workers: int = 4) -> list[str]:
        """`put` each ``(data, digest)`` item; return their digests in order.

        Two phases per batch of 16, on ``workers`` threads (write and fsync release the GIL):
        every new blob's temp file is written and its writeback started, then each is fsynced
        and renamed.  The disk thus gets many files at once, as it gets one large file, instead
        of a few at a time; on this project's benchmark machine that wrote 256 R3 tensor blobs
        (5 MB each) 20-40% faster than writing and fsyncing each in turn.  A batch holds one
        open file per blob; when the process runs out of descriptors, that batch is written one
        blob at a time.  Each directory that gained entries is synced once at the end rather
        than once per blob, all of them together.  Every blob is durable when this returns.

        Raises:
            As `put`.  When an item fails, the batch's other temp files are removed, or, once
            fsyncing began, each is finished or removed (a blob this call renamed into place
            stays: it is a valid blob of its digest); no temp file or descriptor is left.
        """
        if len(items) <= 1 or workers <= 1:
            return [self.put(data, digest) for data, digest in items]
        if len(items) <= _BATCH and _total_bytes(items) <= _INLINE_BYTES:
            return self._put_inline(items)
        digests: list[str] = []
        # Temp files staged and not yet handed to `_finish` (which then owns them): whatever
        # stops this call, even KeyboardInterrupt, they are closed and removed at the end.
        staged: set[_Pending] = set()
        lock = threading.Lock()

        def stage(item: PutItem) -> tuple[str, _Pending | None]:
            digest, pending = self._stage(*item)
            if pending is not None:
                with lock:
                    staged.add(pending)
            return digest, pending

        # Folders made (whose parents gained an entry) and folders renamed into, all synced
        # together at the end (`in_parallel`).
        dirs: set[Path] = set()

        def finish(pending: _Pending) -> None:
            with lock:
                staged.discard(pending)
            self._finish(pending, sync_dir=False, unsynced=dirs)

        pool = Helpers(min(workers, len(items)))
        try:
            for start in range(0, len(items), _BATCH):
                batch = items[start : start + _BATCH]
                futures = [pool.submit(stage, item) for item in batch]
                failed = _first_failure(futures)
                if failed is not None:
                    with lock:
                        for pending in staged:
                            _abandon(pending)
                        staged.clear()
                    if not (isinstance(failed, OSError) and failed.errno in _OUT_OF_FDS):
                        raise failed
                    # Out of file descriptors: this batch one blob at a time, as `put` does.
                    digests.extend(self.put(data, digest) for data, digest in batch)
                    continue
                results = [f.result() for f in futures]
                begun = [pending for _, pending in results if pending is not None]
                failed = _first_failure([pool.submit(finish, p) for p in begun])
                if failed is not None:
                    raise failed
                digests.extend(digest for digest, _ in results)
                # Existing blobs too: another writer may have renamed one in, unsynced yet.
                dirs.update(self.path(digest).parent for digest, _ in results)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            with lock:
                for pending in staged:
                    _abandon(pending)
                staged.clear()
        _fsync_dirs(dirs)
        if dirs:
            failpoint("blob.after_dir_sync")
        return digests

    def _put_inline(self, items: Sequence[PutItem]) -> list[str]:
        """`put_many`'s two phases on the calling thread, for a few small blobs (a small save's
        chunk and manifest): each written, then all synced, then each renamed, then each
        folder synced once.

        NOTE: writing threads gain nothing on a few kilobytes and cost a start each (~1.5 ms
        under load).  The temp files are synced together, then renamed, then every folder
        that gained an entry (the renames' and those of folders made) is synced together:
        fsyncs made together cost the disk one flush where each in turn costs one
        (`in_parallel`; docs/performance.md, "Small saves").
        """
        results: list[tuple[str, _Pending | None]] = []
        try:
            for data, digest in items:
                results.append(self._stage(data, digest))
        except BaseException:
            for _, pending in results:
                if pending is not None:
                    _abandon(pending)
            raise
        begun = [pending for _, pending in results if pending is not None]
        try:
            try:
                in_parallel([functools.partial(os.fsync, pending.fd) for pending in begun])
            finally:
                for pending in begun:
                    with contextlib.suppress(OSError):
                        os.close(pending.fd)
        except BaseException:
            for pending in begun:
                _unlink_temp(pending)
            raise
        dirs = {self.path(digest).parent for digest, _ in results}
        for i, pending in enumerate(begun):
            try:
                self._finish(pending, sync_dir=False, unsynced=dirs, synced=True)
            except BaseException:
                for later in begun[i + 1 :]:
                    _unlink_temp(later)
                raise
        _fsync_dirs(dirs)
        failpoint("blob.after_dir_sync")
        return [digest for digest, _ in results]

    def _stage(
        self, data: Buffer | Sequence[Buffer], digest: str | None
    ) -> tuple[str, _Pending | None]:
        """`put`'s first half: the digest, and a pending temp file unless the blob exists."""
        views, digest = _prepare(data, digest)
        path = self._checked_path(digest)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return digest, self._begin(digest, views)
        # A FIFO or a link there is damage to report, not a blob to dedup against or replace.
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(digest, path, st.st_mode)
        # NOTE: a write is skipped only on an open file: on a shared filesystem (a FUSE
        # client, NFS) a stat may answer from this host's cache for a file another host's GC
        # has since unlinked, and the blob would then never be written anywhere. An open goes
        # to the filesystem (docs/architecture/shared-pools.md, "Shared pools").
        if not self._opens(digest):
            return digest, self._begin(digest, views)
        _check_size(digest, st.st_size, views)
        return digest, None

    def _opens(self, digest: str) -> bool:
        """Whether ``digest``'s file opens as a regular file now."""
        try:
            os.close(self._open_fd(digest))
        except BlobNotFoundError:
            return False
        return True

    def _begin(self, digest: str, views: list[memoryview]) -> _Pending:
        """Write ``views`` to a new read-only temp file and start its writeback; not synced."""
        _check_folders((self._tmp,), digest)
        self._make_folder(self._tmp)
        self._seen.update((self._root, self._tmp))
        tmp = self._tmp / f"{digest}.{os.getpid()}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            hasher = xxhash.xxh3_128()
            for view in views:
                for start in range(0, view.nbytes, _BLOCK):
                    block = view[start : start + _BLOCK]
                    hasher.update(block)
                    _write_all(fd, block)
            # Catches a buffer mutated between the digest pass and this one (a race within
            # one block would slip through; only a copy could prevent that).
            if hasher.hexdigest() != digest:
                raise IntegrityError(f"blob {digest}: the data changed while it was written")
            # Read-only before the rename, so the final name is never writable.
            os.fchmod(fd, 0o444)
            _start_writeback(fd)
        except BaseException:
            _abandon(_Pending(fd, tmp, self.path(digest)))
            raise
        return _Pending(fd, tmp, self.path(digest))

    def _finish(
        self,
        pending: _Pending,
        *,
        sync_dir: bool = True,
        unsynced: set[Path] | None = None,
        synced: bool = False,
    ) -> None:
        """fsync the temp file (unless ``synced``: the caller synced and closed it), then
        rename it to its blob's name; on failure, remove it.  With ``unsynced``, the folders
        this made or renamed into are added there, not synced (the caller syncs them)."""
        tmp, target = pending.tmp, pending.target
        try:
            if not synced:
                try:
                    # Data durable before the rename: the name must never point at unsynced
                    # bytes.
                    os.fsync(pending.fd)
                finally:
                    os.close(pending.fd)
            failpoint("blob.after_temp_write")
            # Again: a fan-out folder made or replaced since `_stage` looked must not be a link.
            _check_folders((self._blobs, target.parent.parent, target.parent), target.name)
            self._make_folder(target.parent, unsynced)
            self._seen.update((self._root, self._blobs))
            # Atomic; concurrent writers of one digest replace identical bytes with identical bytes.
            os.rename(tmp, target)
            failpoint("blob.after_rename")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if unsynced is not None:
            unsynced.add(target.parent)
        elif sync_dir:
            _fsync_dir(target.parent)
            failpoint("blob.after_dir_sync")

    def _open_fd(self, digest: str) -> int:
        """A blocking read descriptor of ``digest``'s file, which must be a regular file."""
        path = self._checked_path(digest)
        try:
            fd = os.open(path, _READ_FLAGS)
        except _MISSING:
            raise _missing(digest) from None
        except OSError:
            # ELOOP for a symlink, ENXIO for a socket, ...: say what is there if it is no file.
            with contextlib.suppress(OSError):
                mode = os.lstat(path).st_mode
                if not stat.S_ISREG(mode):
                    raise _not_regular(digest, path, mode) from None
            raise
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(digest, path, mode)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def get(self, digest: str) -> bytes:
        """The verified bytes of ``digest``; BlobNotFoundError or BlobCorruptError on
        damage."""
        with open(self._open_fd(digest), "rb") as f:
            data = f.read()
        _verify(digest, data)
        return data

    def open(self, digest: str, *, verify: bool = True) -> memoryview:
        """A read-only memory map of ``digest`` for lazy reads, verified unless
        ``verify=False``."""

        return self._mapped(digest, mmap.ACCESS_READ, verify)

    def get_view(self, digest: str) -> memoryview:
        """A read-only memory map of ``digest`` (of `_MAP_MIN` bytes or more; a smaller one
        read), verified; on a networked or FUSE root, where another host could change the
        file under the map (or the mount vanish, which faults a mapped read), a view of
        `get`'s copy.

        NOTE: chunks are read through this (`Archive`): reading a 40 MB chunk into fresh
        bytes cost 20 ms (the kernel zeroing the new pages, then the copy), the map 2.5 ms
        with its verification; R3's numpy load 99.5 -> 85.9 ms (docs/performance.md, "Load
        at the floor").  Safe for the same reason as `open_private`'s map: blobs are
        immutable and GC unlinks.
        """
        if not self._maps_privately():
            return super().get_view(digest)
        return self._mapped(digest, mmap.ACCESS_READ, True, read_below=_MAP_MIN)

    def open_private(self, digest: str) -> memoryview:
        """A private copy-on-write memory map of ``digest`` (of `_MAP_MIN` bytes or more; a
        smaller one read into a buffer of its own), verified: the caller may write to it
        (the pages it writes become its own), and no byte is copied until it does.
        On a networked or FUSE root, where another host could change the file under the
        map, a copy (`AbstractBlobStore.open_private`).

        NOTE: a tensor loaded from a blob uses this map as its memory (docs/architecture/reading.md,
        "Reading"): a copy of 120 MB of routed-expert ids cost more than `torch.load`.  The
        file is never written again (blobs are immutable; GC unlinks, which keeps a mapped
        file's pages), so only damage from outside (truncation) could fault a later read.
        """
        if not self._maps_privately():
            return super().open_private(digest)

        return self._mapped(digest, mmap.ACCESS_COPY, True, read_below=_MAP_MIN)

    def _mapped(self, digest: str, access: int, verify: bool, *, read_below: int = 1) -> memoryview:
        """A memory map of ``digest`` with ``access`` (read-only, or private copy-on-write),
        verified unless ``verify`` is False; a blob of fewer than ``read_below`` bytes read
        instead (read-only, or a writable copy)."""
        fd = self._open_fd(digest)
        try:
            size = os.fstat(fd).st_size
            # (mmap cannot map 0 bytes: an empty blob is read too, a private view writable)
            if size < max(read_below, 1):
                view = _read_fd(fd, access)
            else:
                view = _map_or_read(fd, size, str(self.path(digest)), access)
        finally:
            os.close(fd)  # the map holds its own reference to the file
        if verify:
            try:
                _verify(digest, view)
            except BlobCorruptError:
                view.release()  # a read tried again must not leave the old file mapped
                raise
        return view

    def _maps_privately(self) -> bool:
        """Whether `open_private` and `get_view` map files: the blob folder is on a local
        filesystem.

        NOTE: the blob folder's, not the root's: a root on a local disk (where a SQLite
        catalog must be) may have a network mount at ``blobs/``, whose files another host
        changes or whose mount vanishes under a map (SIGBUS).  Asked at a read of a stored
        blob, so the folder exists.
        """
        if self._private_maps is None:
            table = read_mount_table()
            where = os.path.realpath(self._blobs)
            fstype = None if table is None else filesystem_type(where, table)
            self._private_maps = fstype is not None and not is_network_filesystem(fstype)
        return self._private_maps

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``digest`` from ``offset``, unverified."""
        if offset < 0 or length < 0:
            raise ValueError("offset and length must be >= 0")
        fd = self._open_fd(digest)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def read_head(self, digest: str, n: int) -> bytes:
        """The first ``n`` bytes of ``digest``, unverified (`RetryingReads` does not try it
        again: a probe of a row-less file takes a file gone for nothing to do)."""
        if n < 0:
            raise ValueError("n must be >= 0")
        fd = self._open_fd(digest)
        try:
            return os.pread(fd, n, 0)
        finally:
            os.close(fd)

    def has(self, digest: str) -> bool:
        """True when a regular file exists for ``digest`` (its bytes are not read).

        Opened, not only stat'ed: a save skips writing a blob that `has` finds, and a stat
        on a shared filesystem may answer from a cache another host has made stale."""
        path = self._checked_path(digest)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return False
        except _MISSING:
            return False
        try:
            return self._opens(digest)
        except (OSError, BlobStoreError):
            return True  # there (its stat said so), but not ours to open: as before

    def stat(self, digest: str) -> BlobStat:
        """The size and mtime of ``digest``'s file.

        Raises:
            BlobNotFoundError: no file is there.
            BlobCorruptError: something other than a regular file is there.
        """
        st = self._lstat(digest)
        return BlobStat(st.st_size, st.st_mtime)

    def size(self, digest: str) -> int:
        """The stored size of ``digest`` in bytes (see `stat`)."""
        return self._lstat(digest).st_size

    def _lstat(self, digest: str) -> os.stat_result:
        path = self._checked_path(digest)
        try:
            st = os.lstat(path)
        except _MISSING:
            raise _missing(digest) from None
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(digest, path, st.st_mode)
        return st

    def delete(self, digest: str) -> bool:
        """Unlink ``digest``'s path (a symlink there itself, never its target); False if
        nothing was there."""
        path = self._checked_path(digest)
        # The directory is not synced: a crash may resurrect the file, which is then an
        # orphan the next GC reclaims, while a sync per blob would slow GC of 100k blobs.
        try:
            os.unlink(path)
        except _MISSING:
            return False
        return True

    def check(self, digest: str) -> None:
        """Rehash ``digest`` in 8 MiB reads; BlobCorruptError or BlobNotFoundError on
        damage."""
        hasher = xxhash.xxh3_128()
        size = 0
        with open(self._open_fd(digest), "rb", buffering=0) as f:
            # NOTE: a buffer sized to the file: allocating 8 MiB per small blob made
            # rehashing 100,000 small blobs 5x slower than a plain read-and-hash loop.
            buf = memoryview(bytearray(min(os.fstat(f.fileno()).st_size, _BLOCK) or 1))
            while n := f.readinto(buf):
                hasher.update(buf[:n])
                size += n
        if hasher.hexdigest() != digest:
            raise _corrupt(digest, size, hasher.hexdigest())

    def iter_digests(self) -> Iterator[str]:
        """Digests of the canonical files ``blobs/ab/cd/abcd…``; anything else is ignored."""
        for digest, _ in self._scan():
            yield digest

    def iter_stat(self) -> Iterator[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of each canonical blob file."""
        for digest, entry in self._scan():
            try:
                st = entry.stat(follow_symlinks=False)
            except _MISSING:
                continue  # deleted since it was listed
            yield digest, st.st_size, st.st_mtime

    def _scan(self) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """Regular files with canonical names in real fan-out folders, never through a link.

        PoolLayoutError if ``blobs/`` or a fan-out folder is a symlink; a folder that vanishes
        while listed is skipped.  (A folder swapped for a link between its check and its
        listing leads no unlink astray: `delete` checks the folders again.)
        """
        # scandir, not glob or stat per path: GC lists 100k blobs and must stay well under a second.
        _check_folders((self._blobs,))
        try:
            top = os.scandir(self._blobs_str)
        except FileNotFoundError:
            return
        with top:
            for a in _subfolders(top):
                try:
                    level2 = os.scandir(a.path)
                except _MISSING:
                    continue  # removed (or replaced by a file) since ``blobs/`` was listed
                with level2:
                    for b in _subfolders(level2):
                        try:
                            files = os.scandir(b.path)
                        except _MISSING:
                            continue
                        with files:
                            for f in files:
                                name = f.name
                                # (is_file never raises FileNotFoundError: it says False)
                                if is_blob_name(a.name, b.name, name) and f.is_file(
                                    follow_symlinks=False
                                ):
                                    yield name, f

    def temp_files(self) -> list[tuple[Path, float]]:
        """``(path, mtime)`` of each temp file in ``tmp/``: writes in flight or left by a crash.

        Only regular files named ``*.tmp`` directly in ``tmp/`` are temp files; anything else
        there is not the store's and is left alone.  PoolLayoutError if ``tmp/`` is a symlink.
        """
        _check_folders((self._tmp,))
        found = []
        try:
            entries = os.scandir(self._tmp)
        except FileNotFoundError:
            return []
        with entries:
            for entry in entries:
                if not entry.name.endswith(_TEMP_SUFFIX):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        mtime = entry.stat(follow_symlinks=False).st_mtime
                        found.append((Path(entry.path), mtime))
        return found

    def remove_temp(self, path: str | os.PathLike[str]) -> bool:
        """Unlink a temp file (a regular ``*.tmp`` file directly inside ``tmp/``).

        Returns False if it is gone, or is no longer a regular file (then it is left alone).

        Raises:
            InvalidNameError: ``path`` is not a temp file's name in ``tmp/``.
            PoolLayoutError: ``tmp/`` is a symlink.
        """
        full = os.path.abspath(path)
        if os.path.dirname(full) != str(self._tmp) or not full.endswith(_TEMP_SUFFIX):
            raise InvalidNameError(f"not a temp file of this blob store: {os.fspath(path)!r}")
        _check_folders((self._tmp,))
        try:
            if not stat.S_ISREG(os.lstat(full).st_mode):
                return False
            os.unlink(full)
        except FileNotFoundError:
            return False
        return True

    def incomplete_writes(self) -> list[IncompleteWrite]:
        """The temp files in ``tmp/`` (see `temp_files`), named by their file names."""
        # NOTE: through `temp_files` and `remove_temp`, the filesystem's own words, so that a
        # test replacing either sees GC's sweep go through it.
        return [
            IncompleteWrite(path.name, mtime, _temp_digest(path.name))
            for path, mtime in self.temp_files()
        ]

    def remove_incomplete(self, write: IncompleteWrite) -> bool:
        """Unlink the temp file ``write`` names (see `remove_temp`)."""
        return self.remove_temp(self._tmp / write.name)


def _temp_digest(name: str) -> str | None:
    """The digest a temp file ``<digest>.<pid>.<random>.tmp`` was writing (None: not such a
    name)."""
    head = name.split(".", 1)[0]
    return head if is_digest(head) else None


#: The name this store had before the blob store became an interface; it stays the default.
BlobStore = LocalBlobStore
