"""Memory maps of files that hold no file descriptor (docs/architecture/reading.md, "Chunks in
place").

Python's `mmap.mmap` keeps a duplicate of the file's descriptor open for as long as the map
lives (for its ``size()`` and ``resize()``).  A tensor loaded from its blob uses such a map as
its memory, so a replay buffer holding a thousand of them held a thousand descriptors: at the
common ``ulimit -n`` of 1024 the next load, and any other open of the process (a file, a
socket, a DataLoader worker's pipe), failed with "Too many open files".  `map_file` maps
through libc's ``mmap`` instead, whose map outlives the descriptor as the kernel allows; the
map is unmapped when the last buffer over it goes.

Every map is private (``MAP_PRIVATE``): a read-only view of it is read-only to Python, and a
write through its owner by other means lands in a page of the process's own, never in the
file.  Linux only; elsewhere `map_file` returns None and the caller uses `mmap.mmap`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["map_file", "map_truncated", "mapped"]

_PROT_READ = getattr(mmap, "PROT_READ", 1)
_PROT_WRITE = getattr(mmap, "PROT_WRITE", 2)
_MAP_PRIVATE = getattr(mmap, "MAP_PRIVATE", 2)
_MAP_FAILED = ctypes.c_void_p(-1).value
# A read-only map is writable only for a write through its owner, which Python lets a caller
# reach: without MAP_NORESERVE the kernel charged the whole file to the process's memory
# commit, so under the default overcommit heuristic a read-only map of a blob larger than RAM
# plus swap failed ENOMEM and the store read the whole file instead (MemoryError), where
# Python's read-only map (MAP_SHARED, PROT_READ) cost nothing.  The flag's value differs
# across architectures (Python 3.11's mmap has no name for it): 0 where not known here.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0) or (
    0x4000
    if sys.platform.startswith("linux")
    and platform.machine() in ("x86_64", "aarch64", "arm64", "s390x", "riscv64", "loongarch64")
    else 0
)


def _load_libc() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        do_map, do_unmap = libc.mmap, libc.munmap
    except (OSError, AttributeError, TypeError):
        return None
    do_map.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,  # off_t on 64-bit Linux
    ]
    do_map.restype = ctypes.c_void_p
    do_unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    do_unmap.restype = ctypes.c_int
    return do_map, do_unmap


_LIBC = _load_libc()


class _FileInfo:
    """What a map knows of its file: where it was and which file it was."""

    __slots__ = ("ino", "path")

    def __init__(self, path: str, ino: tuple[int, int]) -> None:
        self.path = path
        self.ino = ino


def map_file(fd: int, size: int, path: str, *, writable: bool) -> memoryview | None:
    """A private map of the first ``size`` bytes (``size`` > 0) of the open file ``fd`` at
    ``path``, as unsigned bytes: writable (copy-on-write) with ``writable``, else read-only.
    The caller may close ``fd`` at once.  None where libc's ``mmap`` cannot be called here.

    Raises:
        OSError: the map could not be made (ENOMEM at vm.max_map_count, ENODEV...).
    """
    if _LIBC is None:
        return None
    do_map, do_unmap = _LIBC
    flags = _MAP_PRIVATE if writable else _MAP_PRIVATE | _MAP_NORESERVE
    address = do_map(None, size, _PROT_READ | _PROT_WRITE, flags, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    try:
        owner = (ctypes.c_char * size).from_address(address)
        st = os.fstat(fd)
        owner._archive_manager_file = _FileInfo(path, (st.st_dev, st.st_ino))  # type: ignore[attr-defined]
        # Never at exit: weakref.finalize's exit hook runs before the atexit handlers
        # registered ahead of it (LIFO) and while daemon threads still run, and a buffer
        # over the map read by either then killed the process (SIGSEGV).  The exit unmaps.
        weakref.finalize(owner, do_unmap, address, size).atexit = False
    except BaseException:
        do_unmap(address, size)
        raise
    view = memoryview(owner).cast("B")
    return view if writable else view.toreadonly()


def mapped(owner: object) -> bool:
    """Whether ``owner`` (a view's ``obj``) is a map of a file: `map_file`'s or
    `mmap.mmap`'s."""
    return isinstance(owner, mmap.mmap) or hasattr(owner, "_archive_manager_file")


def map_truncated(owner: object, size: int) -> bool:
    """Whether ``owner`` (a view's ``obj``) maps a file of ``size`` bytes that has since
    shrunk in place: a read of the map past the file's end would now kill the process
    (SIGBUS).  A file replaced by a rename is not this one (the map keeps the old file)."""
    if isinstance(owner, mmap.mmap):
        return owner.size() < size
    info = getattr(owner, "_archive_manager_file", None)
    if not isinstance(info, _FileInfo):
        return False
    try:
        st = os.stat(info.path)
    except OSError:
        return False  # unlinked (GC): the map keeps the file whole
    return (st.st_dev, st.st_ino) == info.ino and st.st_size < size
