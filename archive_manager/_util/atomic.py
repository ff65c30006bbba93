"""Files written atomically and durably: temp file, fsync, rename (or link), fsync dir.

The one implementation for every file the library writes whole in the pool or beside a run
(the identity file, journal records and checkpoints, the seed facade's pointer files;
docs/architecture/safety-rules.md, "Safety rules").  Blobs have their own batched path
(`archive_manager.blobs`: writeback started early, 16 fsyncs before the renames, read-only
files), and files written for people outside the pool (exports, figures) theirs
(`output.py`: streamed, errors of the medium made one line); both share only `fsync_dir`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from .permissions import readable_bits
from .threads import Helpers

__all__ = ["AtomicWrite", "fsync_dir", "in_parallel", "temp_for", "write_atomic"]

# A filesystem without hard links (some FUSE and object-store mounts) says so with these.
_NO_LINKS = frozenset(
    getattr(errno, name)
    for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK")
    if hasattr(errno, name)
)
# A filesystem that keeps no modes says so with these when asked to change one.
_NO_MODES = frozenset(
    getattr(errno, name) for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP") if hasattr(errno, name)
)


def _create_exclusive(path: Path, data: bytes, mode: int, *, share: bool) -> bool:
    """Exclusive creation without a link: O_EXCL on the final name (a crash mid-write leaves
    a short file, which its reader must refuse as damaged)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    if share:
        _share(fd, path.parent, mode)
    _write_and_close(fd, data)
    fsync_dir(path.parent)
    return True


def _share(fd: int, folder: Path, mode: int) -> None:
    """Give the file open as ``fd`` the read bits of ``mode`` for every class ``folder`` lets
    in (`permissions.readable_bits`), whatever the umask took from ``mode``; before its
    rename or link, so the final name is never less readable."""
    wanted = mode & readable_bits(folder)
    try:
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & wanted != wanted:
            os.fchmod(fd, current | wanted)
    except OSError as exc:
        # A filesystem without modes (some FUSE mounts) refuses: its files have no bits to
        # hide them either.
        if exc.errno not in _NO_MODES:
            raise


def _write_and_close(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``, synced, then closed (also on failure)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path, *, strict: bool = False) -> None:
    """Make a rename or link in ``folder`` durable.

    By default a no-op where folders cannot be opened or synced.  ``strict`` (the blob store)
    raises the error, but for EINVAL and ENOTSUP, with which some network filesystems refuse
    to sync a folder: a blob's rename must not be reported durable after an EIO.
    """
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems refuse fsync on a directory (EINVAL); the rename itself is done.
        if strict and exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


# Threads that wait on the disk for `in_parallel`: made on first use, kept for the process's
# life (idle, they cost nothing; a thread start cost ~1.5 ms of a small save under load).
_SYNC_THREADS = 8
_sync_lock = threading.Lock()
_sync_pool: Helpers | None = None


def _forget_sync_pool() -> None:
    # A child of fork has none of the parent's threads: work handed to the parent's pool
    # would wait for ever.
    global _sync_pool, _sync_lock
    _sync_pool = None
    _sync_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_sync_pool)


def _sync_threads() -> Helpers:
    global _sync_pool
    with _sync_lock:
        if _sync_pool is None:
            _sync_pool = Helpers(_SYNC_THREADS, thread_name_prefix="archive-sync")
        return _sync_pool


def in_parallel(calls: Sequence[Callable[[], object]]) -> None:
    """Run ``calls`` (fsyncs, each waiting on the disk with the GIL released) at the same time:
    the first on the calling thread, the others on the process's sync threads; return once
    every one has ended, raising the error of one that failed, if any did.

    NOTE: fsyncs made one after another each wait for their own flush of the disk's cache
    (1-4 ms on this project's VM); made together, the filesystem commits and flushes them
    as one (five folder fsyncs: ~20 ms in turn, ~1-2 ms together; docs/performance.md,
    "Small saves").  Where no thread can be had (the interpreter is exiting), they run in
    turn.
    """
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    futures: list[concurrent.futures.Future[object]] = []
    try:
        pool = _sync_threads()
        for call in calls[1:]:
            futures.append(pool.submit(call))
    except RuntimeError:  # no new work after interpreter shutdown began
        rest = calls[1 + len(futures) :]
    else:
        rest = []
    first: BaseException | None = None
    for call in (calls[0], *rest):
        try:
            call()
        except BaseException as exc:
            first = first or exc
    for future in futures:
        first = first or future.exception()
    if first is not None:
        raise first


def temp_for(path: Path) -> Path:
    """A temp file's name beside ``path``, unique to this process and call."""
    # The name is cut so that the temp name stays within NAME_MAX when ``path``'s is long.
    return path.with_name(f".{path.name[:64]}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def write_atomic(
    path: Path,
    data: bytes,
    *,
    exclusive: bool = False,
    mode: int = 0o644,
    link_fallback: bool = True,
    before_place: Callable[[], None] | None = None,
    share: bool = False,
) -> bool:
    """Write ``data`` to ``path`` so that readers see the old file, or none, or all of it.

    ``share``: a file of the pool that others read (a journal file, the identity file):
    it gets the read bits of ``mode`` for every class its folder lets in, whatever the
    umask (docs/architecture/shared-pools.md, "Shared pools").  Without it the umask applies, as to
    any file the caller writes (exports, pointer files).

    With ``exclusive``, the file is only created, never replaced: it is linked into place,
    which fails when the name exists (then False is returned and nothing changed), so two
    processes racing to create it cannot both win.  Where the filesystem has no hard links,
    it is created in place with O_EXCL instead, unless ``link_fallback`` is False (then the
    link's error is raised).  ``before_place`` is called between the temp file's fsync and
    its rename or link (where a caller marks its failpoint).

    Returns:
        True if ``path`` now holds ``data``; False only with ``exclusive`` when it existed.
    """
    tmp = temp_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        if share:
            try:
                _share(fd, path.parent, mode)
            except BaseException:
                os.close(fd)
                raise
        _write_and_close(fd, data)
        if before_place is not None:
            before_place()
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in _NO_LINKS or not link_fallback:
                    raise
                return _create_exclusive(path, data, mode, share=share)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return True


class AtomicWrite:
    """`write_atomic` (not ``exclusive``) in two halves: the temp file is written and synced on
    one of the process's sync threads from the start, while the caller goes on (a commit that
    waits on the disk meanwhile); `place` then renames it into place and syncs its folder, or
    `discard` removes it.

    NOTE: the temp file's fsync and the caller's own wait on the disk overlap and cost about
    one flush, where in turn they cost two (`in_parallel`).  A temp file is no file of the pool
    (readers pass over ``.*.tmp`` names; sweeps remove those of dead writers), so writing it
    before the caller's decision is made commits to nothing.
    """

    def __init__(self, path: Path, data: bytes, *, mode: int = 0o644, share: bool = False) -> None:
        self.path = path
        self._tmp = temp_for(path)
        self._data = data
        self._mode = mode
        self._share = share
        self._written: concurrent.futures.Future[None] | None = None
        # No new work after interpreter shutdown began: then written in `place`.
        with contextlib.suppress(RuntimeError):
            self._written = _sync_threads().submit(self._write)

    def _write(self) -> None:
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self._mode)
        try:
            if self._share:
                try:
                    _share(fd, self.path.parent, self._mode)
                except BaseException:
                    os.close(fd)
                    raise
            _write_and_close(fd, self._data)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            raise

    def _wait(self) -> None:
        if self._written is None:
            self._write()
        else:
            self._written.result()

    def place(self, before_place: Callable[[], None] | None = None) -> None:
        """Wait for the temp file, then rename it into place and sync the folder (see
        `write_atomic`; ``before_place`` as there).  Raises the write's error, if it failed;
        no temp file is left either way."""
        try:
            self._wait()
            if before_place is not None:
                before_place()
            os.replace(self._tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
        fsync_dir(self.path.parent)

    def discard(self) -> None:
        """Wait for the temp file, then remove it (the decision it recorded was not made)."""
        if self._written is not None:
            concurrent.futures.wait([self._written])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)
