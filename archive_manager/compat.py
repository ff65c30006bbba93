"""`RolloutArchive`: the seed's calls (slime/vime's straw-backed archive) on a pool.

Each saved rollout gets a small JSON *pointer file* where the caller asked for the archive
(``rollout_3.json``): it names the pool and the archive and carries the sample metadata, so a
metadata check against a training run's settings reads that one file and nothing else.

A pointer file is input, not configuration: it holds no password, and opening one never
connects to a database server it names, nor opens a SQLite file it names before a read-only
look proved that file a catalog.  A server catalog's URL, credentials included, comes from
the caller (``catalog_url=``, ``args.archive_catalog_url`` or ``$ARCHIVE_MANAGER_CATALOG_URL``),
and must reach the database the pointer was written for.

Pointer format version 2 records a server catalog as ``catalog`` (its URL without a
password, for identification only); version 1 recorded ``catalog_url``, password and all,
and is still read: that URL is reduced to the same identification at once and never used.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import stat
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import xxhash

from ._util.atomic import write_atomic
from ._util.digest import check_digest
from ._util.failpoints import failpoint
from ._util.names import MAX_NAME_BYTES, invisible_character
from .catalog.engine import catalog_identity, parse_url, public_url, shown_url, sqlite_path
from .catalog.migrate import CATALOG_URL_ENV
from .catalog.probe import probe_sqlite_catalog
from .errors import (
    ArchiveExistsError,
    ArchiveNotFoundError,
    CatalogError,
    ForeignCatalogError,
    InvalidInputError,
    MetadataError,
    PoolNotFoundError,
    UnsupportedFormatError,
)
from .manager import ArchiveManager, default_catalog_url
from .metadata import validate_sample_metadata
from .pool.archive import Archive

__all__ = [
    "POINTER_FORMAT",
    "POINTER_VERSION",
    "READABLE_POINTER_VERSIONS",
    "RolloutArchive",
    "archive_name_for",
]

POINTER_FORMAT = "archive_manager.pointer"
POINTER_VERSION = 2
#: Version 1 recorded the catalog as ``catalog_url``, with its password when it had one.
READABLE_POINTER_VERSIONS = (1, 2)
_REQUIRED = ("format", "version", "pool_root", "archive", "manifest_digest")
#: A pointer holds a few hundred bytes of metadata per sample: 64 MiB is far beyond any
#: rollout, and a bigger file is not a pointer (nor read whole into memory to find out).
MAX_POINTER_BYTES = 64 << 20


def archive_name_for(path: str | os.PathLike[str], generation: int = 1) -> str:
    """The archive name of a pointer path: its absolute path, made safe for a name.

    Two runs that both save ``rollout_3.json`` in different folders of one shared pool get
    different names.  ``%``, ``/``, ``\\``, whitespace, control and other invisible
    characters and ``..`` are percent-encoded, and so is every non-ASCII character of a path
    that is not in Unicode NFC (new names are stored in NFC: a path spelt otherwise would
    not keep its own name); a name that would pass 255 bytes keeps its tail and gains a
    digest of the whole path.  A ``generation`` past 1 (a path saved again after its first
    archive was released) adds ``%~<generation>``, which no path's encoding contains: ``%``
    is always encoded as ``%25``.
    """
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        raise InvalidInputError("generation must be an int >= 1")
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
    suffix = "" if generation == 1 else f"%~{generation}"
    if len((name + suffix).encode("utf-8")) > MAX_NAME_BYTES:
        tag = "~" + xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass")) + suffix
        tail = name.encode("utf-8")[-(MAX_NAME_BYTES - len(tag)) :].decode("utf-8", "ignore")
        return tail + tag
    return name + suffix


def _configured(
    args: Any, root: str | os.PathLike[str] | None, catalog_url: str | None
) -> tuple[Path | None, str | None]:
    """The caller's pool root and catalog URL: arguments first, then ``args``'s."""
    if root is None and args is not None:
        root = getattr(args, "archive_root", None) or None
    if catalog_url is None and args is not None:
        catalog_url = getattr(args, "archive_catalog_url", None) or None
    if catalog_url is not None and not isinstance(catalog_url, str):
        raise InvalidInputError("catalog_url must be a str (a SQLAlchemy URL)")
    return (Path(root).expanduser().absolute() if root else None), catalog_url


def _pool_location(path: Path, args: Any) -> tuple[Path, str | None]:
    root, url = _configured(args, None, None)
    return root or path.parent / "archive-pool", url


def _free_name(pool: ArchiveManager, target: Path) -> str:
    """The name to save ``target``'s archive under: its first generation not yet taken.

    A released archive keeps its name (its rows stay for inspection), so a path saved again
    after its archive was released takes the next generation; the pointer records it.
    """
    for generation in itertools.count(1):
        name = archive_name_for(target, generation)
        try:
            archive = pool.open_archive(name)
        except ArchiveNotFoundError:
            return name  # free, or a save in flight, which pool.save then refuses
        if archive.state != "released":
            hint = "" if _is_default(pool) else " --catalog-url URL"
            raise ArchiveExistsError(
                f"pointer file {target} does not exist, but the archive {name!r} saved for it "
                f"is still {archive.state} in the pool at {pool.root}: another process is "
                "saving to this path right now, or the pointer file was deleted without "
                "releasing its archive; release it (archive-manager --root "
                f"{shlex.quote(str(pool.root))}{hint} release {shlex.quote(name)}, or "
                "Archive.release()) and save again, or save to another path"
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _is_default(pool: ArchiveManager) -> bool:
    return catalog_identity(pool.catalog_url) == catalog_identity(default_catalog_url(pool.root))


def _is_sqlite(url: str) -> bool:
    return parse_url(url).get_backend_name() == "sqlite"


def _open_pool(
    path: Path,
    pointer: dict[str, Any],
    root: Path | None,
    catalog_url: str | None,
    read_only: bool | None = None,
) -> ArchiveManager:
    """Open the pool of a pointer, connecting to nothing and opening nothing it alone names.

    The caller's root and catalog win over the pointer's.  A server catalog is reached only
    through a URL the caller configured, and only if it is the database the pointer was
    written for; a SQLite file the pointer names is looked at read-only first, and opened
    only if it is an archive_manager catalog.
    """
    pool_root = root if root is not None else Path(pointer["pool_root"]).expanduser()
    pool_root = pool_root.absolute()
    recorded = pointer.get("catalog") or default_catalog_url(pool_root.resolve())
    if catalog_url is None and not _is_sqlite(recorded):
        catalog_url = os.environ.get(CATALOG_URL_ENV) or None
        if catalog_url is None:
            raise ForeignCatalogError(
                f"pointer file {path} names the catalog {shown_url(recorded)}, and a pointer "
                "file does not choose the database server to connect to: pass that catalog's "
                "URL with its credentials as catalog_url= (or args.archive_catalog_url), or "
                f"set ${CATALOG_URL_ENV}"
            )
    if catalog_url is not None and catalog_identity(catalog_url) != catalog_identity(recorded):
        raise ForeignCatalogError(
            f"pointer file {path} was written for the catalog {shown_url(recorded)}, not "
            f"the configured {shown_url(catalog_url)}; nothing was opened: configure the "
            "catalog the pointer names, or open the archive by name with ArchiveManager"
        )
    if not pool_root.is_dir():
        raise PoolNotFoundError(f"no pool at {pool_root} (named by pointer file {path})")
    if catalog_url is None:
        file = sqlite_path(recorded)
        if file is None:
            raise ForeignCatalogError(f"pointer file {path} names an in-memory catalog")
        probe = probe_sqlite_catalog(file)
        if probe.kind in ("absent", "empty"):
            raise PoolNotFoundError(
                f"no pool at {pool_root}: no catalog at {file} (named by pointer file {path})"
            )
        if probe.kind in ("foreign", "not-sqlite"):
            raise ForeignCatalogError(
                f"pointer file {path} names {file}, which is not an archive_manager catalog "
                f"({probe.reason}); it was left untouched"
            )
        catalog_url = pointer.get("catalog")  # None: the pool root's own catalog
    return ArchiveManager.open(pool_root, catalog_url, create=False, read_only=read_only)


def _write_pointer(path: Path, content: dict[str, Any]) -> None:
    """Write ``path`` atomically and only if it does not exist (link(2) is exclusive).

    Raises:
        FileExistsError: ``path`` exists; nothing was written.
    """
    data = json.dumps(content, indent=1, allow_nan=False).encode()
    # NOTE: 0666 minus the umask, like any file the run writes (a 0600 pointer would hide it
    # from the rest of a team that shares the run folder).  Linked, never created in place:
    # a short pointer left by a crash would name an archive nobody can read or release.
    if not write_atomic(
        path,
        data,
        exclusive=True,
        mode=0o666,
        link_fallback=False,
        before_place=lambda: failpoint("pointer.before_link"),
    ):
        raise FileExistsError(f"pointer file {path} already exists")


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


def _recorded_catalog(path: Path, pointer: dict[str, Any]) -> str | None:
    """The catalog a pointer records, as its URL without a password (None: the SQLite file in
    its pool root); removes version 1's ``catalog_url`` from ``pointer``."""
    key = "catalog_url" if pointer["version"] == 1 else "catalog"
    raw = pointer.pop("catalog_url", None) if key == "catalog_url" else pointer.get(key)
    pointer.pop("catalog_url", None)  # not a field of version 2: never read, never shown
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed {key}")
    try:
        return public_url(raw)
    except CatalogError:
        # The text is not echoed: it may hold a password.
        raise UnsupportedFormatError(
            f"pointer file {path} has a malformed {key} (not a SQLAlchemy URL)"
        ) from None


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
    version = pointer.get("version")
    if type(version) is not int or version not in READABLE_POINTER_VERSIONS:
        raise UnsupportedFormatError(
            f"{path} is pointer version {version!r}; this library reads versions "
            f"{', '.join(map(str, READABLE_POINTER_VERSIONS))}"
        )
    # NOTE: before anything else can fail and show the pointer: a version 1 pointer's
    # catalog_url may hold a password, which must not outlive this function.
    pointer["catalog"] = _recorded_catalog(path, pointer)
    missing = [k for k in _REQUIRED if k not in pointer]
    if missing:
        raise UnsupportedFormatError(f"pointer file {path} lacks {', '.join(missing)}")
    if (
        not isinstance(pointer["pool_root"], str)
        or "\x00" in pointer["pool_root"]
        or not isinstance(pointer["archive"], str)
    ):
        raise UnsupportedFormatError(f"pointer file {path} has a malformed pool_root or archive")
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
        self,
        path: str | os.PathLike[str],
        root: str | os.PathLike[str] | None = None,
        *,
        catalog_url: str | None = None,
        args: Any = None,
        read_only: bool | None = None,
    ) -> None:
        """Open the archive a pointer file names.

        The caller's configuration wins over the pointer's: ``root`` (else
        ``args.archive_root``) over the pool root it records, ``catalog_url`` (else
        ``args.archive_catalog_url``) over its catalog.  A pointer whose pool has a server
        catalog needs that catalog's URL, with credentials, from the caller (those, or
        ``$ARCHIVE_MANAGER_CATALOG_URL``): the pointer holds none, and nothing it names
        alone is ever connected to.  ``read_only`` is `ArchiveManager.open`'s: None opens
        the pool read-only when this process cannot write it (then `release` raises
        `ReadOnlyPoolError`).

        Raises:
            FileNotFoundError: no pointer file at ``path``.
            UnsupportedFormatError: not a pointer file, or of another format or version.
            PoolNotFoundError: the pool it names does not exist.
            ForeignCatalogError: it names a server catalog and none was configured, or one
                other than the configured one, or a file that is no catalog (nothing was
                opened).
            MetadataError: the catalog's archive is not the one the pointer was written for.
        """
        self.path = Path(path)
        self.pointer = _read_pointer(self.path)
        pool_root, url = _configured(args, root, catalog_url)
        self.pool = _open_pool(self.path, self.pointer, pool_root, url, read_only)
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
        The pointer file records the catalog without its password.

        A path may be saved again once its pointer file is gone and its archive released:
        the new archive takes the next generation of the path's name (`archive_name_for`).

        Raises:
            FileExistsError: ``path`` exists (nothing is saved), or appeared meanwhile (the
                archive just saved is released again).
            ArchiveExistsError: (a FileExistsError) the path's archive is still published
                though its pointer file is gone; the message says how to release it.
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
                with cls(ref_path, catalog_url=url) as source:
                    same = catalog_identity(source.pool.catalog_url) == catalog_identity(
                        pool.catalog_url
                    )
                    if not same or source.pool.root != pool.root:
                        raise InvalidInputError("a reference must live in the same pool")
                    ref = pool.open_archive(source.archive.name)
            name = _free_name(pool, target)
            if ref is not None:
                arc = pool.save(
                    name, None, rollout_id=rollout_id, evaluation=evaluation, reference=ref
                )
            else:
                arc = pool.save(name, samples, rollout_id=rollout_id, evaluation=evaluation)
            pointer: dict[str, Any] = {
                "format": POINTER_FORMAT,
                "version": POINTER_VERSION,
                "pool_root": str(pool.root),
            }
            if not _is_default(pool):
                # Which database, for telling it apart: never a password, never a URL
                # that opening the pointer connects to (see _open_pool).
                pointer["catalog"] = public_url(pool.catalog_url)
            pointer |= {
                "archive": arc.name,
                "manifest_digest": arc.manifest_digest,
                "rollout_id": arc.rollout_id,
                "evaluation": arc.evaluation,
                "samples": len(arc),
                "metadata": arc.sample_metadata(),
            }
            try:
                _write_pointer(target, pointer)
            except FileExistsError:
                arc.release()
                raise FileExistsError(f"pointer file {target} appeared while saving") from None
            except BaseException:
                arc.release()  # no pointer names it: nothing could ever read or release it
                raise
        return cls(target, root=pool_root, catalog_url=url)

    @staticmethod
    def check_metadata(path: str | os.PathLike[str], args: Any) -> list[dict[str, Any]]:
        """Check an archive's samples against a training run's settings, reading only the
        pointer file (or, for a pointer without metadata, the catalog, found as
        `RolloutArchive` finds it with ``args.archive_root`` and ``args.archive_catalog_url``)
        — never a blob.

        Returns:
            The sample metadata (one `describe_sample` dict per sample).

        Raises:
            MetadataError: a sample does not fit ``args`` (every violation is listed).
        """
        pointer = _read_pointer(Path(path))
        metadata = pointer.get("metadata")
        if metadata is None:
            with RolloutArchive(path, args=args) as arc:
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
        materialize: bool = False,
    ) -> list[Any]:
        """All samples, or those matching every key given (see `Archive.load_samples`)."""
        return self.archive.load_samples(
            sample_key=sample_key, task_key=task_key, as_arrays=as_arrays, materialize=materialize
        )

    def iter_samples(
        self,
        *,
        sample_key: str | None = None,
        task_key: str | None = None,
        as_arrays: bool = False,
        materialize: bool = False,
    ) -> Iterator[Any]:
        """The samples streamed in bounded memory (see `Archive.iter_samples`)."""
        return self.archive.iter_samples(
            sample_key=sample_key, task_key=task_key, as_arrays=as_arrays, materialize=materialize
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
