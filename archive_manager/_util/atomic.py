"""Files written atomically and durably: temp file, fsync, rename (or link), fsync dir.

The one implementation for every file the library writes whole in the pool or beside a run
(the identity file, journal records and checkpoints, the seed facade's pointer files;
docs/architecture/safety-rules.md, "Safety rules").  Blobs have their own batched path
(`archive_manager.blobs`: writeback started early, 16 fsyncs before the renames, read-only
files), and files written for people outside the pool (exports, figures) theirs
(`output.py`: streamed, errors of the medium made one line); both share only `fsync_dir`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from .permissions import readable_bits

__all__ = ["fsync_dir", "temp_for", "write_atomic"]

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
