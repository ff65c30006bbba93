"""Files written outside the pool, for people and other programs: exports and figures.

One path for all of them (docs/architecture/getting-data-out.md, "Getting data out"): a temp file
beside the target, created like any file a program makes (``0666`` less the umask), filled, fsynced
and renamed over the target; on any failure the temp file is removed and the target is left as
it was.  A failure of where the file goes (a full disk, a quota, a file size limit, a
read-only filesystem, no permission, an I/O error) is raised as `OutputWriteError`, one line
naming the file and what to do, also when a library hides the OS's error inside its own
(torch reports a full disk as ``RuntimeError: ... unexpected pos``).

Only errors raised while writing count: the writer marks those regions (`Output.writing`,
`Output.stream`), so a failure to read the pool during an export keeps its own error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import ArchiveError, ArchiveExistsError, InvalidInputError, OutputWriteError
from .atomic import fsync_dir, temp_for
from .lazy_torch import torch_module

__all__ = ["Output", "check_target", "output_error", "save_torch", "write_output"]

#: What each failure of the medium is, and what the person who asked for the file can do.
_REASONS = {
    errno.ENOSPC: ("no space left on the device", "free some space or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free some of your space or write elsewhere"),
    errno.EFBIG: (
        "file too large for the filesystem or for this process's file size limit",
        "write elsewhere, or raise the limit (ulimit -f)",
    ),
    errno.EROFS: ("the filesystem is read-only", "write elsewhere"),
    errno.EACCES: ("permission denied", "write to a folder you may write"),
    errno.EPERM: ("operation not permitted", "write to a folder you may write"),
    errno.EIO: ("input/output error, the device failed", "check it, or write elsewhere"),
}


def output_error(target: Path, error: OSError, *, existed: bool) -> OutputWriteError:
    """`OutputWriteError` for ``error``, met while writing ``target`` (which ``existed``
    before)."""
    code = error.errno
    kept = "the file there was left as it was" if existed else "no partial file was left"
    if code is not None and code in _REASONS:
        what, advice = _REASONS[code]
        text = f"{what} ({errno.errorcode[code]}); {kept}; {advice}"
    else:
        reason = " ".join((error.strerror or str(error) or type(error).__name__).split())
        text = f"{reason}; {kept}"
    return OutputWriteError(f"cannot write {target}: {text}", code, str(target))


def check_target(target: Path, *, overwrite: bool) -> None:
    """Refuse, before any work, a target that exists (unless ``overwrite``) or is a folder.

    Raises:
        ArchiveExistsError: ``target`` exists and ``overwrite`` is False.
        InvalidInputError: ``target`` is a folder.
    """
    # is_symlink: a dangling link is something at that name too, not to be replaced silently
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise ArchiveExistsError(f"{target} exists; pass --force (overwrite=True) to replace it")
    if target.is_dir():
        raise InvalidInputError(f"{target} is a folder")


class _RecordingFile:
    """A binary file that notes the first `OSError` its writes raise before raising it: a
    library writing through it (torch) may swallow the error and raise its own."""

    def __init__(self, file: BinaryIO, output: Output) -> None:
        self._file = file
        self._output = output

    def write(self, data: bytes) -> int:
        with self._output.writing():
            return self._file.write(data)

    def flush(self) -> None:
        with self._output.writing():
            self._file.flush()


class Output:
    """One file being written outside the pool: ``path`` is its temp file; the writer
    wraps each write in `writing` (or writes through `stream`), so that a failure there is
    known to be the medium's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed: OSError | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Mark a block that writes the file (any thread): an `OSError` raised inside is
        the medium's."""
        try:
            yield
        except OSError as exc:
            if not isinstance(exc, ArchiveError):
                with self._lock:
                    if self.failed is None:
                        self.failed = exc
            raise

    def stream(self, file: BinaryIO) -> BinaryIO:
        """``file`` with every write and flush marked (for writers that take a file)."""
        return _RecordingFile(file, self)  # type: ignore[return-value]


def write_output(
    target: Path,
    write: Callable[[Output], object],
    *,
    overwrite: bool = True,
) -> Path:
    """Write a file at ``target`` outside the pool: ``write(output)`` fills
    ``output.path`` (a temp file beside ``target``, already created, mode ``0666`` less the
    umask), marking its writes (`Output.writing`, `Output.stream`); it is then fsynced and
    renamed over ``target``.  Missing parent folders are made.

    Raises:
        ArchiveExistsError, InvalidInputError: `check_target`'s refusals, before any write.
        OutputWriteError: the medium failed (full, read-only, no permission...); ``target``
            is as it was and no temp file is left.
        Exception: whatever ``write`` raised otherwise (the same cleanup).
    """
    check_target(target, overwrite=overwrite)
    existed = target.exists()
    temp = temp_for(target)  # its name stays within NAME_MAX
    output = Output(temp)
    created = False
    # the folders this call makes, innermost first: a failed write removes them again
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
    try:
        with output.writing():
            target.parent.mkdir(parents=True, exist_ok=True)
            # O_EXCL: a name no other process holds; 0o666: the umask decides, as for any
            # file a program writes for its user.
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            created = True
        write(output)
        with output.writing():
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, target)
    except BaseException as exc:
        # (a cleanup that fails too must not hide why the write failed; a folder another
        # process filled meanwhile stays)
        if created:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        failed = output.failed
        if failed is not None and isinstance(exc, Exception):
            raise output_error(target, failed, existed=existed) from exc
        raise
    fsync_dir(target.parent)
    return target


def save_torch(value: object, output: Output) -> None:
    """``torch.save(value)`` into ``output``'s file, through a file object whose writes are
    marked: torch turns the OS's error of a failed write into ``RuntimeError: ... unexpected
    pos`` (a full disk then printed torch's traceback), so the error is taken from the
    write itself."""
    with output.writing():
        file = open(output.path, "wb")  # noqa: SIM115 (closed below, its error marked)
    try:
        torch_module().save(value, output.stream(file))
    finally:
        with output.writing():
            file.close()
