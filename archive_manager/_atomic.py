"""Small files written atomically and durably: temp file, fsync, rename (or link), fsync dir.

Blobs have their own batched path (`archive_manager.blobs`); this is for the pool's few
other files (the identity file, exports, pointer files), where one write at a time is fine.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]

# A filesystem without hard links (some FUSE and object-store mounts) says so with these.
_NO_LINKS = frozenset(
    getattr(errno, name)
    for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK")
    if hasattr(errno, name)
)


def _create_exclusive(path: Path, data: bytes, mode: int) -> bool:
    """Exclusive creation without a link: O_EXCL on the final name (a crash mid-write leaves
    a short file, which its reader must refuse as damaged)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    _write_and_close(fd, data)
    fsync_dir(path.parent)
    return True


def _write_and_close(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``, synced, then closed (also on failure)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """Make a rename or link in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        # Some filesystems refuse fsync on a directory (EINVAL); the rename itself is done.
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False, mode: int = 0o644) -> bool:
    """Write ``data`` to ``path`` so that readers see the old file, or none, or all of it.

    With ``exclusive``, the file is only created, never replaced: it is linked into place,
    which fails when the name exists (then False is returned and nothing changed), so two
    processes racing to create it cannot both win.

    Returns:
        True if ``path`` now holds ``data``; False only with ``exclusive`` when it existed.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        _write_and_close(fd, data)
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                return _create_exclusive(path, data, mode)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return True
