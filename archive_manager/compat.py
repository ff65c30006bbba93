"""`RolloutArchive`: the seed's calls (slime/vime's straw-backed archive) on a pool.

Each saved rollout gets a small JSON *pointer file* where the caller asked for the archive
(``rollout_3.json``): it names the pool and the archive and carries the sample metadata, so a
metadata check against a training run's settings reads that one file and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import unicodedata
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from ._digest import check_digest
from ._failpoints import failpoint
from ._names import MAX_NAME_BYTES, invisible_character
from .archive import Archive
from .errors import InvalidInputError, MetadataError, UnsupportedFormatError
from .manager import ArchiveManager, default_catalog_url
from .metadata import validate_sample_metadata

__all__ = ["POINTER_FORMAT", "POINTER_VERSION", "RolloutArchive", "archive_name_for"]

POINTER_FORMAT = "archive_manager.pointer"
POINTER_VERSION = 1
_REQUIRED = ("format", "version", "pool_root", "archive", "manifest_digest")
#: A pointer holds a few hundred bytes of metadata per sample: 64 MiB is far beyond any
#: rollout, and a bigger file is not a pointer (nor read whole into memory to find out).
MAX_POINTER_BYTES = 64 << 20


def archive_name_for(path: str | os.PathLike[str]) -> str:
    """The archive name of a pointer path: its absolute path, made safe for a name.

    Two runs that both save ``rollout_3.json`` in different folders of one shared pool get
    different names.  ``%``, ``/``, ``\\``, whitespace, control and other invisible
    characters and ``..`` are percent-encoded, and so is every non-ASCII character of a path
    that is not in Unicode NFC (new names are stored in NFC: a path spelt otherwise would
    not keep its own name); a name that would pass 255 bytes keeps its tail and gains a
    digest of the whole path.
    """
    text = os.path.abspath(Path(path).expanduser())
    not_nfc = not unicodedata.is_normalized("NFC", text)
    out = []
    for ch in text:
        if (
            ch in "%/\\"
            or ch.isspace()
            or invisible_character(ch) is not None
            or (not_nfc and not ch.isascii())
        ):
            # NOTE: the UTF-8 bytes, each as %XX: ``%{ord(ch):X}`` made U+2000 and " 00"
            # both "%2000".  Surrogates (undecodable bytes in a file name) are no valid name
            # text, so they are encoded too.
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    name = "".join(out)
    while ".." in name:
        name = name.replace("..", ".%2E")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        tag = "~" + xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))
        tail = name.encode("utf-8")[-(MAX_NAME_BYTES - len(tag)) :].decode("utf-8", "ignore")
        name = tail + tag
    return name


def _pool_location(path: Path, args: Any) -> tuple[Path, str | None]:
    root = getattr(args, "archive_root", None) if args is not None else None
    url = getattr(args, "archive_catalog_url", None) if args is not None else None
    pool_root = Path(root).expanduser() if root else path.parent / "archive-pool"
    return pool_root.absolute(), url or None


def _write_pointer(path: Path, content: dict[str, Any]) -> None:
    """Write ``path`` atomically and only if it does not exist (link(2) is exclusive)."""
    data = json.dumps(content, indent=1, allow_nan=False).encode()
    tmp = path.parent / f".{path.name[:64]}.{uuid.uuid4().hex}.tmp"
    # NOTE: not mkstemp, whose 0600 would hide the pointer from the rest of a team that
    # shares the run folder; 0666 minus the umask, like any file the run writes.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # NOTE: link() fails if the name exists, so two savers to one path cannot both win,
        # and readers never see a half-written pointer.
        failpoint("pointer.before_link")
        os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_text(path: Path) -> str:
    # NOTE: opened without blocking and checked to be a regular file of sane size before
    # reading: a FIFO at the path hung forever, /dev/zero filled memory.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsupportedFormatError(f"{path} is not a pointer file (not a regular file)")
        if st.st_size > MAX_POINTER_BYTES:
            raise UnsupportedFormatError(
                f"{path} is not a pointer file ({st.st_size} bytes; pointer files are at "
                f"most {MAX_POINTER_BYTES})"
            )
        return f.read(MAX_POINTER_BYTES + 1).decode("utf-8")


def _read_pointer(path: Path) -> dict[str, Any]:
    try:
        text = _read_text(path)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise UnsupportedFormatError(f"cannot read pointer file {path}: {exc}") from exc
    try:
        pointer = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UnsupportedFormatError(f"{path} is not a pointer file (not JSON: {exc})") from exc
    if not isinstance(pointer, dict):
        raise UnsupportedFormatError(f"{path} is not a pointer file (not a JSON object)")
    if pointer.get("format") != POINTER_FORMAT:
        raise UnsupportedFormatError(
            f"{path} is not an {POINTER_FORMAT} file (format {pointer.get('format')!r})"
        )
    if pointer.get("version") != POINTER_VERSION or type(pointer["version"]) is not int:
        raise UnsupportedFormatError(
            f"{path} is pointer version {pointer.get('version')!r}; this library reads "
            f"version {POINTER_VERSION}"
        )
    missing = [k for k in _REQUIRED if k not in pointer]
    if missing:
        raise UnsupportedFormatError(f"pointer file {path} lacks {', '.join(missing)}")
    if (
        not isinstance(pointer["pool_root"], str)
        or "\x00" in pointer["pool_root"]
        or not isinstance(pointer["archive"], str)
    ):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed pool_root or archive")
    if not isinstance(pointer.get("catalog_url"), (str, type(None))):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed catalog_url")
    check_digest(pointer["manifest_digest"])
    metadata = pointer.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, list) and all(isinstance(m, dict) for m in metadata)
    ):
        raise UnsupportedFormatError(f"pointer file {path} has malformed metadata")
    return pointer


class RolloutArchive:
    """An archive reached through its pointer file, with the seed's calls.

    ``RolloutArchive.save(path, samples, rollout_id=...)`` saves and writes the pointer;
    ``RolloutArchive(path)`` opens it (a context manager: `close` releases the pool's
    connections, not the data; `release` lets GC reclaim the data).
    """

    def __init__(
        self, path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None
    ) -> None:
        """Open the archive a pointer file names; ``root`` overrides the pool it records.

        Raises:
            FileNotFoundError: no pointer file at ``path``.
            UnsupportedFormatError: not a pointer file, or of another format or version.
            PoolNotFoundError: the pool it names does not exist.
            MetadataError: the catalog's archive is not the one the pointer was written for.
        """
        self.path = Path(path)
        self.pointer = _read_pointer(self.path)
        pool_root = Path(root) if root is not None else Path(self.pointer["pool_root"])
        self.pool = ArchiveManager.open(pool_root, self.pointer.get("catalog_url"), create=False)
        try:
            self.archive: Archive = self.pool.open_archive(self.pointer["archive"])
            if self.archive.manifest_digest != self.pointer["manifest_digest"]:
                raise MetadataError(
                    f"pointer {self.path} names manifest {self.pointer['manifest_digest']} but "
                    f"archive {self.archive.name!r} has {self.archive.manifest_digest}: the "
                    "archive was replaced, or the pointer belongs to another pool"
                )
        except BaseException:
            self.pool.close()
            raise

    @classmethod
    def save(
        cls,
        path: str | os.PathLike[str],
        samples: Sequence[Any] | None,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        args: Any = None,
        reference: RolloutArchive | str | os.PathLike[str] | None = None,
    ) -> RolloutArchive:
        """Save ``samples`` into a pool and write a pointer file at ``path``.

        The pool is ``args.archive_root`` (or ``args.archive_catalog_url``) when given, else
        ``<path's folder>/archive-pool``, so archives saved in one folder share a pool and
        dedup.  ``reference`` (a `RolloutArchive` or its pointer path) shares its chunks.

        Raises:
            FileExistsError: ``path`` exists (nothing is saved), or appeared meanwhile (the
                archive just saved is released again).
        """
        target = Path(path).expanduser().absolute()
        if os.path.lexists(target):
            raise FileExistsError(f"pointer file {target} already exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        pool_root, url = _pool_location(target, args)
        with ArchiveManager.open(pool_root, url) as pool:
            ref: Archive | None = None
            if reference is not None:
                ref_path = (
                    reference.path if isinstance(reference, RolloutArchive) else Path(reference)
                )
                with cls(ref_path) as source:
                    if source.pool.catalog_url != pool.catalog_url:
                        raise InvalidInputError("a reference must live in the same pool")
                    ref = pool.open_archive(source.archive.name)
            name = archive_name_for(target)
            if ref is not None:
                arc = pool.save(
                    name, None, rollout_id=rollout_id, evaluation=evaluation, reference=ref
                )
            else:
                arc = pool.save(name, samples, rollout_id=rollout_id, evaluation=evaluation)
            pointer = {
                "format": POINTER_FORMAT,
                "version": POINTER_VERSION,
                "pool_root": str(pool.root),
                "archive": arc.name,
                "manifest_digest": arc.manifest_digest,
                "rollout_id": arc.rollout_id,
                "evaluation": arc.evaluation,
                "samples": len(arc),
                "metadata": arc.sample_metadata(),
            }
            if pool.catalog_url != default_catalog_url(pool.root):
                pointer["catalog_url"] = pool.catalog_url
            try:
                _write_pointer(target, pointer)
            except FileExistsError:
                arc.release()
                raise FileExistsError(f"pointer file {target} appeared while saving") from None
            except BaseException:
                arc.release()  # no pointer names it: nothing could ever read or release it
                raise
        return cls(target)

    @staticmethod
    def check_metadata(path: str | os.PathLike[str], args: Any) -> list[dict[str, Any]]:
        """Check an archive's samples against a training run's settings, reading only the
        pointer file (or, for a pointer without metadata, the catalog) — never a blob.

        Returns:
            The sample metadata (one `describe_sample` dict per sample).

        Raises:
            MetadataError: a sample does not fit ``args`` (every violation is listed).
        """
        pointer = _read_pointer(Path(path))
        metadata = pointer.get("metadata")
        if metadata is None:
            with RolloutArchive(path) as arc:
                metadata = arc.archive.sample_metadata()
        validate_sample_metadata(metadata, args)
        return metadata

    # ------------------------------------------------------------------ reading

    @property
    def name(self) -> str:
        """The archive's name in its pool."""
        return self.archive.name

    @property
    def rollout_id(self) -> int | None:
        """The rollout id it was saved with."""
        return self.archive.rollout_id

    @property
    def evaluation(self) -> bool:
        """Whether it holds evaluation samples."""
        return self.archive.evaluation

    def __len__(self) -> int:
        return len(self.archive)

    def keys(self) -> list[tuple[str, str | None]]:
        """``(sample_key, task_key)`` per sample, in order."""
        return self.archive.keys()

    def load_samples(
        self,
        sample_key: str | None = None,
        task_key: str | None = None,
        *,
        as_arrays: bool = False,
    ) -> list[Any]:
        """All samples, or those matching every key given (see `Archive.load_samples`)."""
        return self.archive.load_samples(
            sample_key=sample_key, task_key=task_key, as_arrays=as_arrays
        )

    def sample_metadata(self) -> list[dict[str, Any]]:
        """Per-sample metadata from the catalog."""
        return self.archive.sample_metadata()

    def export_pt(self, path: str | os.PathLike[str]) -> Path:
        """Write slime's ``torch.save`` dump format (see `Archive.export_pt`)."""
        return self.archive.export_pt(path)

    def release(self) -> bool:
        """Let GC reclaim the archive (its pointer file stays; rows stay for inspection)."""
        return self.archive.release()

    def close(self) -> None:
        """Close the pool's connections; idempotent."""
        self.pool.close()

    def __enter__(self) -> RolloutArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RolloutArchive({str(self.path)!r}, archive={self.archive.name!r})"
