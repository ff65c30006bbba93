"""Pool identity: which catalog and which blob root form one pool
(docs/architecture/pool-identity.md, "Pool identity").

A pool gets a random ``pool_id`` when it is created, and the catalog that serves it a random
``catalog_id``.  Both are recorded twice: in the catalog (``pool_info``) and in the small file
``<root>/archive-pool.json``.  Every open compares the two and refuses, naming both sides,
when they are not one pool's.  That is what stops the accidents that lose published archives:
a second job opening the blob root with another catalog (each GC would delete the other's
blobs as orphans), a copied pool used in place of the original, a stale catalog used after the
root was re-bound.  The identity file is written before a new catalog claims an empty root,
and exclusively (a hard link, which fails when the name exists), so of two catalogs racing
for one root exactly one wins.

Deliberate ways through, each explicit:

* ``recover=True`` (``archive-manager rebuild-catalog``): an empty catalog takes over a blob
  root whose catalog was lost; GC stays refused until `rebuild_catalog` has indexed the blobs.
* ``rebind=True`` (``archive-manager rebind``): a copy of a pool (``cp -a pool copy``) becomes
  a pool of its own, with a new identity, so the copy and the original can never be confused.
* A pool folder moved as a whole (its default catalog inside it) is followed, as before;
  so is a pool moved to another object-store prefix, once its old prefix no longer holds it
  (while it does, the new one is a copy).
* Pools written before identities existed get one on their first open by the catalog that
  indexes their blobs.

An open is not enough: `check_identity` asks again, before each write that would go astray,
whether the root still holds the pool opened (a pool moved, deleted or unmounted while a job
has it open; `PoolContext.check_in_place`).  An empty root (no identity file, no spare, no
blob) is never taken for a pool its catalog records: it is an empty mount point.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select

from .._util.atomic import write_atomic
from .._util.constants import UNINDEXED_BLOBS
from .._util.permissions import share_like_parent
from .._util.pool_files import (
    IDENTITY_FILE,
    IDENTITY_FORMAT,
    IDENTITY_VERSION,
    SPARE_FILE,
    PoolIdentity,
    parse_identity,
    read_identity_file,
)
from ..blobs.base import ObjectRoot
from ..catalog import (
    Catalog,
    archives_table,
    blobs_table,
    get_pool_info,
    set_pool_info,
)
from ..catalog.engine import public_url
from ..errors import PoolIdentityError, PoolNotFoundError, PoolRootMissingError

__all__ = [
    "IDENTITY_FILE",
    "SPARE_FILE",
    "UNINDEXED_BLOBS",
    "PoolIdentity",
    "bind_pool",
    "check_identity",
    "check_pool_read_only",
    "check_sqlite_copy",
    "read_identity",
    "safe_url",
]

#: The spare's name below an object-store root (docs/architecture/object-stores.md, "Blobs on an
#: object store"): where the filesystem keeps it, below ``blobs/``, which the blob listing skips.
_SPARE_OBJECT = f"blobs/{SPARE_FILE}"
# How many blob files an identity-less catalog must index before it may claim their root.
_SAMPLE = 64


def safe_url(url: str) -> str:
    """``url`` with its password removed (what the identity file and messages may hold)."""
    try:
        return public_url(url)
    except Exception:  # an unparsable URL is refused elsewhere; show nothing of it here
        return "<unparsable catalog URL>"


#: Where a pool's blobs and small files are: a folder, or a root on an object store (whose
#: identity file is an object below its prefix, read and written through `ObjectRoot`).
Root = Path | ObjectRoot


def read_identity(root: Root) -> PoolIdentity | None:
    """The identity recorded at ``root`` (None if it has none): its identity file, or, if an
    operator deleted that, the copy kept under ``blobs/``.

    Raises:
        PoolIdentityError: a file exists but is not an identity file (damaged, or not a
            regular file).
    """
    if not isinstance(root, Path):
        found = parse_identity(root.read(IDENTITY_FILE), f"{root}/{IDENTITY_FILE}")
        if found is None:
            found = parse_identity(root.read(_SPARE_OBJECT), f"{root}/{_SPARE_OBJECT}")
        return found
    found = read_identity_file(root / IDENTITY_FILE)
    if found is None and not (root / "blobs").is_symlink():
        found = read_identity_file(root / "blobs" / SPARE_FILE)
    return found


def _file_bytes(identity: PoolIdentity) -> bytes:
    content: dict[str, Any] = {
        "format": IDENTITY_FORMAT,
        "version": IDENTITY_VERSION,
        "pool_id": identity.pool_id,
        "catalog_id": identity.catalog_id,
        "catalog": identity.catalog,
        "bound_at": identity.bound_at,
        "note": "archive_manager pool identity: do not edit; a copied pool takes a new one with 'archive-manager rebind'",
    }
    return (json.dumps(content, indent=1) + "\n").encode()


def _write_identity(root: Root, ident: PoolIdentity, *, exclusive: bool = False) -> bool:
    """Write the identity file (exclusively: False if one exists), then its spare copy."""
    data = _file_bytes(ident)
    if not isinstance(root, Path):
        if not root.write(IDENTITY_FILE, data, exclusive=exclusive):
            return False
        root.write(_SPARE_OBJECT, data)
        return True
    # share: every member and reader opens through it, whatever this writer's umask.
    if not write_atomic(root / IDENTITY_FILE, data, exclusive=exclusive, share=True):
        return False
    _write_spare(root, data)
    return True


def _write_spare(root: Path, data: bytes) -> None:
    blobs = root / "blobs"
    if blobs.is_symlink():
        return  # the blob store refuses such a pool anyway
    try:
        blobs.mkdir()
    except FileExistsError:
        pass
    else:
        share_like_parent(blobs)
    write_atomic(blobs / SPARE_FILE, data, share=True)


def _ensure_files(root: Root, ident: PoolIdentity) -> None:
    """After a successful open: both files present (either may have been deleted)."""
    if not isinstance(root, Path):
        if root.read(IDENTITY_FILE) is None:
            root.write(IDENTITY_FILE, _file_bytes(ident), exclusive=True)
        if root.read(_SPARE_OBJECT) is None:
            current = root.read(IDENTITY_FILE)
            root.write(_SPARE_OBJECT, _file_bytes(ident) if current is None else current)
        return
    if not (root / IDENTITY_FILE).exists():
        write_atomic(root / IDENTITY_FILE, _file_bytes(ident), exclusive=True, share=True)
    spare = root / "blobs" / SPARE_FILE
    if not spare.exists() and not (root / "blobs").is_symlink():
        _write_spare(root, (root / IDENTITY_FILE).read_bytes())


def _catalog_identity(conn: Any) -> PoolIdentity | None:
    pool_id, catalog_id = get_pool_info(conn, "pool_id"), get_pool_info(conn, "catalog_id")
    if pool_id is None or catalog_id is None:
        return None
    return PoolIdentity(pool_id, catalog_id)


def _new_id() -> str:
    return uuid.uuid4().hex


def _indexes(catalog: Catalog, digests: list[str]) -> bool:
    """Whether the catalog has a row for each of ``digests`` (a sample of the root's files)."""
    if not digests:
        return True
    with catalog.read() as conn:
        known = set(
            conn.execute(
                select(blobs_table.c.digest).where(blobs_table.c.digest.in_(digests))
            ).scalars()
        )
    return known.issuperset(digests)


@dataclass
class _State:
    """What one open sees: the catalog's side and the root's side."""

    recorded_root: str | None
    catalog_id: PoolIdentity | None
    file_id: PoolIdentity | None
    has_archives: bool
    unindexed: bool


def _read_state(catalog: Catalog, root: Root) -> _State:
    # NOTE: the catalog first, then the file: a new pool's identity file is written before its
    # catalog records it (`_write_identity`, then `_commit_new`), so a catalog identity read
    # first has its file in place.  The other order let an open racing a pool's creation read
    # no file, then the catalog's new identity, and refuse the pool as an emptied root.
    with catalog.read() as conn:
        recorded = get_pool_info(conn, "blob_root")
        ident = _catalog_identity(conn)
        has_archives = bool(conn.execute(select(exists().where(archives_table.c.id > 0))).scalar())
        unindexed = get_pool_info(conn, UNINDEXED_BLOBS) is not None
    file_id = read_identity(root)
    return _State(recorded, ident, file_id, has_archives, unindexed)


def bind_pool(
    catalog: Catalog,
    root: Root,
    *,
    url: str,
    explicit_url: bool,
    list_blobs: Callable[[int], list[str]],
    clock: Callable[[], float],
    recover: bool = False,
    rebind: bool = False,
) -> PoolIdentity:
    """Check that ``catalog`` and the blob root ``root`` are one pool's, binding them if new.

    ``list_blobs(n)`` returns up to ``n`` digests of blob files under the root (any n of
    them).  See the module docstring for ``recover`` and ``rebind``.

    Raises:
        PoolIdentityError: they are not one pool's, with what each side says and what to do.
    """
    for _ in range(8):  # each retry follows a racing process that wrote first
        state = _read_state(catalog, root)
        if rebind:
            rebound = _rebind(catalog, root, state, url=url, explicit_url=explicit_url, clock=clock)
            _ensure_files(root, rebound)
            return rebound
        result = _bind_once(
            catalog,
            root,
            state,
            url=url,
            explicit_url=explicit_url,
            list_blobs=list_blobs,
            clock=clock,
            recover=recover,
        )
        if result is not None:
            _ensure_files(root, result)
            return result
    raise PoolIdentityError(f"the identity of the pool at {root} keeps changing under this open")


def _bind_once(
    catalog: Catalog,
    root: Root,
    s: _State,
    *,
    url: str,
    explicit_url: bool,
    list_blobs: Callable[[int], list[str]],
    clock: Callable[[], float],
    recover: bool,
) -> PoolIdentity | None:
    shown = safe_url(url)
    here = str(root)
    moved = s.recorded_root is not None and s.recorded_root != here
    c, f = s.catalog_id, s.file_id
    if moved and not isinstance(root, Path) and c is not None and c.same_as(f):
        # An object-store root is named by its URL alone, seen alike from every machine:
        # there are no mount points, so this is a copy, or the pool moved (copied, then
        # deleted at its old prefix).  Only a look at the recorded root tells them apart.
        _refuse_object_copy(root, s, shown)
        with catalog.write("identity.move") as conn:
            set_pool_info(conn, "blob_root", here)
        return f
    if moved and c is not None and c.same_as(f):
        recorded = Path(s.recorded_root)  # type: ignore[arg-type]
        if _same_folder(recorded, root):
            return f  # one folder reached by two paths (a symlink, a bind mount)
        if explicit_url and not _holds_pool(recorded):
            # One pool seen at another mount point (each machine mounts the shared blob
            # root where it likes): the ids prove it is this pool; the recorded path, which
            # other machines still use, is left as it is.
            return f
    # NOTE: the recorded folder is looked into, not only for: a move leaves an empty folder
    # there where the old path is a mount point (or made again), and that is a move, not a
    # copy (a rebind the "copy" refusal advises would give the real pool a new identity).
    if moved and (explicit_url or _holds_pool(Path(s.recorded_root))):  # type: ignore[arg-type]
        _refuse_other_root(s, root, shown, explicit_url=explicit_url)
    if c is not None and f is not None:
        if c.same_as(f):
            if moved:
                # The pool folder was moved as a whole (catalog inside it): follow it.
                with catalog.write("identity.move") as conn:
                    set_pool_info(conn, "blob_root", here)
            return f
        if recover and not s.has_archives:
            return _adopt(catalog, root, f, url=url, list_blobs=list_blobs, clock=clock)
        if c.pool_id == f.pool_id:
            raise PoolIdentityError(
                f"the blob root {root} was re-bound to another catalog ({f.catalog or '?'}, "
                f"catalog id {f.catalog_id[:12]}), probably by a rebuild-catalog after this "
                f"catalog ({shown}, catalog id {c.catalog_id[:12]}) was thought lost; this "
                "catalog no longer serves the pool: open the pool with the other catalog"
            )
        raise PoolIdentityError(
            f"the catalog {shown} belongs to pool {c.pool_id[:12]}, but the blob root {root} "
            f"belongs to pool {f.pool_id[:12]} (catalog {f.catalog or '?'}): open the root with "
            "its own catalog (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL)"
            + (
                "; if a rebind of this root was interrupted, run 'archive-manager rebind' again"
                if s.recorded_root == here
                else ""
            )
        )
    if c is not None:  # f is None: the identity file was lost, or a crash came before it
        sample = list_blobs(_SAMPLE)
        if not sample:
            raise _empty_root(root, shown, c, s)
        if not s.unindexed and not _indexes(catalog, sample):
            raise PoolIdentityError(
                f"the catalog {shown} (pool {c.pool_id[:12]}) does not index the blobs under "
                f"{root}, and the root has no identity file: another catalog writes here"
            )
        ident = PoolIdentity(c.pool_id, c.catalog_id, shown, clock())
        if not _write_identity(root, ident, exclusive=True):
            return None
        if moved:
            with catalog.write("identity.move") as conn:
                set_pool_info(conn, "blob_root", here)
        return ident
    # The catalog has no identity: new, or written before identities existed.
    blobs = list_blobs(_SAMPLE)
    if f is not None:
        if f.catalog == shown and (
            (s.recorded_root is None and not blobs)
            or (s.recorded_root == here and not s.unindexed and _indexes(catalog, blobs))
        ):
            # This catalog's own creation (or first open by this version) was killed between
            # writing the identity file and committing it to the catalog.
            return _commit_new(catalog, root, f, unindexed=False)
        if recover and not s.has_archives:
            return _adopt(catalog, root, f, url=url, list_blobs=list_blobs, clock=clock)
        if f.catalog == shown:
            raise PoolIdentityError(
                f"the catalog {shown} of pool {f.pool_id[:12]} at {root} is empty (lost, "
                "emptied or replaced) while the blob root holds the pool's blobs: run "
                "'archive-manager rebuild-catalog' to restore it from them "
                "(ArchiveManager.open(root, recover=True), then rebuild_catalog())"
            )
        raise PoolIdentityError(
            f"the blob root {root} belongs to pool {f.pool_id[:12]}, whose catalog is "
            f"{f.catalog or '?'}; this catalog ({shown}) is not that pool's. Open the root with "
            "its catalog (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL); if that catalog was "
            "lost, run 'archive-manager rebuild-catalog' to take over the root with this one"
        )
    if s.recorded_root is None:  # a new catalog
        if recover and not blobs:
            raise PoolNotFoundError(
                f"nothing to recover at {root}: it holds no pool identity and no blobs"
            )
        if blobs and not recover:
            raise PoolIdentityError(
                f"the blob root {root} holds blobs but no pool identity, and the catalog "
                f"{shown} is new: if this root's catalog was lost, run 'archive-manager "
                "rebuild-catalog' (ArchiveManager.open(..., recover=True), then "
                "rebuild_catalog()); if another catalog indexes these blobs, open the root "
                "with that catalog"
            )
        ident = PoolIdentity(_new_id(), _new_id(), shown, clock())
        if not _write_identity(root, ident, exclusive=True):
            return None
        return _commit_new(catalog, root, ident, unindexed=bool(blobs))
    # A catalog written before identities existed, bound to this root: the migration.
    if (s.unindexed or not _indexes(catalog, blobs)) and not recover:
        raise PoolIdentityError(
            f"the catalog {shown} does not index the blobs under {root} (written by "
            "another catalog, or this catalog was emptied): open the root with the "
            "catalog that wrote them, or run 'archive-manager rebuild-catalog'"
        )
    ident = PoolIdentity(_new_id(), _new_id(), shown, clock())
    if not _write_identity(root, ident, exclusive=True):
        return None
    return _commit_new(catalog, root, ident, unindexed=s.unindexed)


def _empty_root(root: Root, shown: str, c: PoolIdentity, s: _State) -> PoolRootMissingError:
    """The refusal of a root with no identity and no blob whose catalog serves a pool.

    NOTE: the identity file is written before a catalog records an identity, so such a root
    is not where the pool was bound: a mount that failed on this host (its empty mount point
    at the path), a moved or emptied folder, a deleted prefix.  Taking it for the pool wrote
    a new identity there and saved onto the wrong disk; when the mount came back, the
    archives published meanwhile had no blobs.
    """
    what = "records archives" if s.has_archives else "has no archives yet"
    return PoolRootMissingError(
        f"the blob root {root} is empty (no pool identity, no blobs) but the catalog {shown} "
        f"serves pool {c.pool_id[:12]} there and {what}: the blob root looks unmounted (a "
        "mount point whose mount failed), moved or emptied. Nothing was written; mount it, or "
        "open the pool where its files are"
    )


def check_pool_read_only(
    catalog: Catalog, root: Root, *, url: str, list_blobs: Callable[[int], list[str]]
) -> PoolIdentity:
    """`bind_pool` for a reader: check that ``catalog`` and ``root`` are one pool's, writing
    nothing (docs/architecture/pool-identity.md, "Pool identity", and
    docs/architecture/shared-pools.md, "Shared pools").

    Both sides must name one pool (or the root's identity file was lost and the catalog
    indexes its blobs).  Where they are, the recorded root is not compared: a reader sees the
    pool through a read-only mount, a snapshot or a copy, at any path, and writes nothing
    that could make a copy pass for the original.  What a writable open would repair (an
    identity to record, a moved pool to follow) is refused with what to run.

    Raises:
        PoolIdentityError: they are not one pool's, or only a writable open can tell.
    """
    s = _read_state(catalog, root)
    shown = safe_url(url)
    c, f = s.catalog_id, s.file_id
    if c is not None and c.same_as(f):
        return f  # type: ignore[return-value]
    if c is not None and f is None:
        sample = list_blobs(_SAMPLE)
        if not sample:
            raise _empty_root(root, shown, c, s)
        if not s.unindexed and _indexes(catalog, sample):
            return PoolIdentity(c.pool_id, c.catalog_id, shown)
    if c is not None and f is not None:
        raise PoolIdentityError(
            f"the catalog {shown} belongs to pool {c.pool_id[:12]}/{c.catalog_id[:12]}, but the "
            f"blob root {root} to pool {f.pool_id[:12]}/{f.catalog_id[:12]}: open the root with "
            "its own catalog (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL)"
        )
    raise PoolIdentityError(
        f"the catalog {shown} and the blob root {root} cannot be told to be one pool without "
        "writing (the catalog has no pool identity yet, or does not index these blobs); open "
        "the pool once with write access, then read it here"
    )


def _same_folder(a: Path, b: Root) -> bool:
    if not isinstance(b, Path):
        return False  # an object store's root is named by its URL alone
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _commit_new(
    catalog: Catalog, root: Root, ident: PoolIdentity, *, unindexed: bool
) -> PoolIdentity:
    """Record ``ident`` (already in the root's file) in the catalog, unless a racing open of
    the same catalog recorded one first, which must then be the same."""
    with catalog.write("identity.bind") as conn:
        current = _catalog_identity(conn)
        if current is not None:
            if not current.same_as(ident):
                raise PoolIdentityError(
                    f"the catalog {ident.catalog} was bound to pool {current.pool_id[:12]} while "
                    f"this open bound the blob root {root} to pool {ident.pool_id[:12]}"
                )
            return ident
        set_pool_info(conn, "pool_id", ident.pool_id)
        set_pool_info(conn, "catalog_id", ident.catalog_id)
        if get_pool_info(conn, "blob_root") is None:
            set_pool_info(conn, "blob_root", str(root))
        if unindexed:
            set_pool_info(conn, UNINDEXED_BLOBS, "1")
    return ident


def _adopt(
    catalog: Catalog,
    root: Root,
    f: PoolIdentity,
    *,
    url: str,
    list_blobs: Callable[[int], list[str]],
    clock: Callable[[], float],
) -> PoolIdentity:
    """``recover``: this empty catalog takes over the pool ``f`` (its catalog was lost)."""
    ident = PoolIdentity(f.pool_id, _new_id(), safe_url(url), clock())
    with catalog.write("identity.adopt") as conn:
        set_pool_info(conn, "pool_id", ident.pool_id)
        set_pool_info(conn, "catalog_id", ident.catalog_id)
        set_pool_info(conn, "blob_root", str(root))
        if list_blobs(1):
            set_pool_info(conn, UNINDEXED_BLOBS, "1")
    # NOTE: after the catalog's commit: a crash in between leaves the file naming the old
    # catalog id, which this (non-empty only after a rebuild) catalog can adopt again.
    _write_identity(root, ident)
    return ident


def _rebind(
    catalog: Catalog,
    root: Root,
    s: _State,
    *,
    url: str,
    explicit_url: bool,
    clock: Callable[[], float],
) -> PoolIdentity:
    """``rebind``: this root is a copy of a pool; give it (and its catalog) a new identity."""
    shown = safe_url(url)
    c, f = s.catalog_id, s.file_id
    if s.recorded_root is None:
        raise PoolIdentityError(
            f"the catalog {shown} is new: there is no pool to rebind (open the pool without "
            "rebind to create one)"
        )
    if s.recorded_root == str(root):
        if c is not None and f is not None and c.pool_id != f.pool_id:
            # A rebind killed between its catalog commit and the identity file: finish it.
            ident = PoolIdentity(c.pool_id, c.catalog_id, shown, clock())
            _write_identity(root, ident)
            return ident
        raise PoolIdentityError(f"the pool at {root} is already bound to the catalog {shown}")
    if c is not None and f is not None and c.pool_id != f.pool_id:
        raise PoolIdentityError(
            f"the catalog {shown} belongs to pool {c.pool_id[:12]} but the blob root {root} to "
            f"pool {f.pool_id[:12]}: a copy has the same pool id on both sides; these are not "
            "a pool and its copy"
        )
    if explicit_url:
        original = Path(s.recorded_root)
        try:
            source = read_identity(original)
        except PoolIdentityError:
            source = None
        # A copy of the database has the same ids as the original's: only the URL tells
        # the original's own database (which must not be taken) from a copy of it.
        if source is not None and c is not None and c.same_as(source) and source.catalog == shown:
            raise PoolIdentityError(
                f"the catalog {shown} still serves the pool at {original}: a copy needs a copy "
                "of the catalog too (e.g. pg_dump the database into a new one) and that new "
                "catalog's URL"
            )
    ident = PoolIdentity(_new_id(), _new_id(), shown, clock())
    with catalog.write("identity.rebind") as conn:
        set_pool_info(conn, "pool_id", ident.pool_id)
        set_pool_info(conn, "catalog_id", ident.catalog_id)
        set_pool_info(conn, "blob_root", str(root))
    _write_identity(root, ident)
    return ident


def _refuse_object_copy(root: ObjectRoot, s: _State, shown: str) -> None:
    """Refuse ``root`` (same identity as the catalog's, at another place than the recorded
    root) unless the recorded root no longer holds the pool: then it moved.

    NOTE: the filesystem's test (does the recorded path exist here?) never holds for a URL,
    and took every copy of a bucket prefix for the pool seen at another mount point: saves
    through the copy published archives whose blobs the original never had.
    """
    recorded = s.recorded_root
    assert recorded is not None
    if not recorded.startswith("s3://"):
        raise PoolIdentityError(
            f"the catalog {shown} belongs to the pool at {recorded}, not {root}: two pools "
            "must not share one catalog"
        )
    try:
        there = read_identity(root.other(recorded))
    except (PoolIdentityError, OSError) as exc:
        raise PoolIdentityError(
            f"{root} holds the pool identity of the pool at {recorded}, which the catalog "
            f"{shown} serves, and whether that pool is still there cannot be told ({exc}): a "
            "copy must not pass for the original. If the pool was moved here, retry when its "
            "old place can be read; to use a copy as a pool of its own, open it with a new, "
            "empty catalog and recover=True ('archive-manager rebuild-catalog')"
        ) from exc
    assert s.catalog_id is not None
    # The pool's id alone: a recorded prefix re-bound since (a recover) is still the pool.
    if there is not None and there.pool_id == s.catalog_id.pool_id:
        raise PoolIdentityError(
            f"the pool at {root} is a copy of the pool at {recorded} (same identity), whose "
            f"catalog {shown} is: a copy must not be opened with the original's catalog, or "
            "its saves would publish archives whose blobs only the copy has. To use the copy "
            "as a pool of its own, open it with a new, empty catalog and recover=True "
            "('archive-manager rebuild-catalog'), which gives it a catalog of its own"
        )


def _holds_pool(folder: Path) -> bool:
    """Whether the folder a catalog records still holds a pool: an identity (or its spare),
    or anything at all (an identity deleted beside blobs).  Absent or empty (a mount point
    left behind by a move, an unmounted disk): it does not, and the pool was moved."""
    try:
        if read_identity(folder) is not None:
            return True
        with os.scandir(folder) as found:
            return any(True for _ in found)
    except FileNotFoundError:
        return False
    except (OSError, PoolIdentityError):
        return True  # unreadable or damaged: never taken for "moved"


def _recorded_root_read_only(file: Path) -> str | None:
    """The ``blob_root`` a SQLite catalog file records, read without writing anything (no
    migration, no ``-wal``/``-shm`` created); None when it cannot be read so."""
    import sqlite3

    logs = any(Path(f"{file}{side}").exists() for side in ("-wal", "-shm"))
    # immutable: touches no file and takes no lock, exact when there is no log beside it;
    # with one, a read-only open that reads the log (the -shm exists already).
    mode = "mode=ro" if logs else "immutable=1"
    try:
        conn = sqlite3.connect(f"{file.as_uri()}?{mode}", uri=True, timeout=1.0)
        try:
            row = conn.execute("SELECT value FROM pool_info WHERE key = 'blob_root'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0]) if row is not None and row[0] is not None else None


def check_sqlite_copy(root: Path, file: Path) -> None:
    """Before a writable open touches the SQLite catalog ``file`` of the folder ``root`` (its
    migration included): refuse a copy of another pool, writing nothing.

    NOTE: the identity check of `bind_pool` runs on an open catalog, after its migration: a
    copy made with ``cp -al`` (rsnapshot, ``rsync --link-dest``) shares the catalog's inode
    with the original, so the refused open had already migrated the original's catalog, with
    ``-wal``/``-shm`` of its own beside a database another process may be writing.  And where
    the original's path was gone from this machine, the copy was taken for the pool moved and
    wrote its own path into the shared catalog.  So: a catalog recording another folder that
    still holds this pool is a copy; a hard-linked catalog recording another folder is never
    written by an open (only a rebind, which replaces the linked file first).

    Raises:
        PoolIdentityError: a copy, or a hard-linked catalog of a pool recorded elsewhere.
    """
    try:
        st = file.stat()
    except OSError:
        return
    recorded = _recorded_root_read_only(file)
    if recorded is None or recorded == str(root):
        return
    other = Path(recorded)
    if _same_folder(other, root):
        return
    if _holds_pool(other):
        mine = read_identity(root)
        theirs = read_identity(other) if other.is_dir() else None
        if mine is not None and mine.same_as(theirs):
            raise PoolIdentityError(
                f"the pool at {root} is a copy of the pool at {recorded} (same identity); "
                "nothing was written; to use the copy as a pool of its own, run "
                f"'archive-manager --root {root} rebind' (ArchiveManager.open(root, "
                "rebind=True)), which gives it a new identity"
            )
    if st.st_nlink > 1:
        raise PoolIdentityError(
            f"the catalog {file} records the pool at {recorded} and is a hard link shared "
            f"with another file ({st.st_nlink} names: a copy made with 'cp -al' or 'rsync "
            "--link-dest'?): opening it here would write the other pool's catalog through "
            f"it. Nothing was written; run 'archive-manager --root {root} rebind' to make "
            "this copy a pool of its own, or open it read-only"
        )


def _refuse_other_root(s: _State, root: Root, shown: str, *, explicit_url: bool) -> None:
    copy = s.catalog_id is not None and s.catalog_id.same_as(s.file_id)
    if copy and not explicit_url:
        raise PoolIdentityError(
            f"the pool at {root} is a copy of the pool at {s.recorded_root} (same identity); "
            f"to use the copy as a pool of its own, run 'archive-manager --root {root} rebind' "
            "(ArchiveManager.open(root, rebind=True)), which gives it a new identity"
        )
    raise PoolIdentityError(
        f"the catalog {shown} belongs to the pool at {s.recorded_root}, not {root}: two pools "
        "must not share one catalog"
    )


def check_identity(root: Root, expected: PoolIdentity | None, *, what: str = "gc") -> None:
    """Refuse ``what`` (a write: a save's blobs or publication, a retention decision, GC's
    deletions) unless ``root`` still holds the pool this process opened as ``expected``
    (docs/architecture/pool-identity.md, "Pool identity": is this the pool I opened).

    A pool moved, renamed or deleted while a process has it open, a mount that went away
    (its empty mount point left at the path), an object-store prefix moved or deleted, or a
    root re-bound to another catalog meanwhile: each would send the write to a place that is
    not the pool the catalog indexes, and the catalog would then publish (or GC delete)
    against blobs that are elsewhere.  ``expected`` None (a pool made without `open`): only
    that a folder root is still there.

    Raises:
        PoolRootMissingError: the root, or its identity, is gone.
        PoolIdentityError: the root holds another pool's identity.
    """
    if isinstance(root, Path) and not root.is_dir():
        raise PoolRootMissingError(
            f"the pool root {root} is gone since this pool was opened (moved, renamed, "
            f"deleted or unmounted?): {what} refused before writing anything; open the pool "
            "where it is now"
        )
    if expected is None:
        return
    found = read_identity(root)
    if found is None:
        raise PoolRootMissingError(
            f"{root} no longer holds the pool this process opened: its identity "
            f"({IDENTITY_FILE}) is gone (the pool moved away, its files were deleted, or a "
            f"mount went away and left an empty folder?): {what} refused before writing "
            "anything; reopen the pool where it is now"
        )
    if not expected.same_as(found):
        raise PoolIdentityError(
            f"the pool identity at {root} changed while this pool was open (now "
            f"{found.pool_id[:12]}/{found.catalog_id[:12]}): {what} refused; reopen the pool"
        )
