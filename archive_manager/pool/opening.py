"""Opening a pool: find its catalog and blob store, check that they are one pool's, and
refuse before anything is written when they are not (docs/architecture/pool-identity.md).

`open_pool` does what `ArchiveManager.open` promises (its docstring is the contract) for a
pool on a folder, on an object store, read-only, or for its catalog only, and returns the
`Opened` parts; the facade wraps them.  A refused open leaves the pool as it was: a catalog
file or folders this open made are removed again (`Opened.abandon`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import exc as sa_exc

from .._util.atomic import fsync_dir
from .._util.constants import default_catalog_url
from .._util.permissions import share_like_parent
from ..blobs import AbstractBlobStore, ReadOnlyView, local_pool_store
from ..blobs.base import ObjectRoot, is_s3_url
from ..catalog import Catalog, get_pool_info
from ..catalog.engine import (
    dialect_of,
    filesystem_type,
    make_engine,
    parse_url,
    read_mount_table,
    shown_url,
    sqlite_path,
)
from ..catalog.migrate import current_revision, head_revision
from ..catalog.probe import probe_sqlite_catalog
from ..errors import (
    CatalogError,
    InvalidInputError,
    PoolIdentityError,
    PoolNotFoundError,
    ReadOnlyPoolError,
)
from .identity import (
    IDENTITY_FILE,
    PoolIdentity,
    bind_pool,
    check_pool_read_only,
    check_sqlite_copy,
    read_identity,
    safe_url,
)
from .journal import JOURNAL_DIR

__all__ = [
    "CatalogStatus",
    "Opened",
    "catalog_status",
    "open_pool",
    "pool_exists",
    "remove_sqlite_files",
]

_log = logging.getLogger("archive_manager")


@dataclass(frozen=True)
class CatalogStatus:
    """A catalog's Alembic revision (None: no catalog yet) and this library's head."""

    current: str | None
    head: str

    @property
    def up_to_date(self) -> bool:
        """Whether the catalog is at this library's head revision."""
        return self.current == self.head


@dataclass
class Opened:
    """What an open found: the blob root, the catalog (open), the store, the identity it
    checked (None for a catalog-only open), and what this open made, to undo if the pool
    is refused after all.  ``adopt_journal``: the journal's newer decisions are to be
    adopted into the catalog (a writable open)."""

    root: Path | ObjectRoot
    catalog: Catalog
    store: AbstractBlobStore
    identity: PoolIdentity | None
    made_catalog: Path | None = None
    made_folders: list[Path] = field(default_factory=list)
    adopt_journal: bool = False

    def abandon(self) -> None:
        """Close the catalog and remove what this open made: a SQLite catalog file and
        folders, the latter only while empty (a refused open leaves no folder behind)."""
        self.catalog.close()
        remove_sqlite_files(self.made_catalog)
        for folder in self.made_folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


def open_pool(
    root: str | os.PathLike[str],
    catalog_url: str | None = None,
    *,
    clock: Callable[[], float] | None = None,
    busy_timeout_ms: int | None = None,
    create: bool = True,
    recover: bool = False,
    rebind: bool = False,
    read_only: bool | None = None,
    store: AbstractBlobStore | None = None,
    catalog_only: bool = False,
) -> Opened:
    """Open the pool at ``root`` as `ArchiveManager.open` says (arguments, refusals and
    errors are documented there)."""
    if read_only not in (None, True, False):
        raise InvalidInputError("read_only must be True, False or None (detect)")
    if read_only and (recover or rebind):
        what = "recover" if recover else "rebind"
        raise ReadOnlyPoolError(f"{what} writes the pool; it cannot run read-only")
    if catalog_only:
        if recover or rebind or read_only is False:
            raise InvalidInputError(
                "catalog_only opens the pool read-only: it takes no recover, rebind or "
                "read_only=False"
            )
        return _open_catalog_only(
            root,
            catalog_url,
            busy_timeout_ms=busy_timeout_ms,
            store=store,
        )
    if store is not None and not isinstance(store, AbstractBlobStore):
        raise InvalidInputError(
            f"store must be an archive_manager.blobs.AbstractBlobStore, not {type(store).__name__}"
        )
    if store is not None and store.read_only and read_only is not True:
        # A reader's store (pool.store of a read-only pool) under a writable catalog would
        # let every save and gc begin in the catalog, then fail at the blobs.
        raise InvalidInputError(
            f"the store passed in refuses writes ({store.read_only_reason}): open the pool "
            "with read_only=True, or pass a writable store"
        )
    if is_s3_url(root):
        return _open_object_store(
            str(root),
            catalog_url,
            clock=clock,
            busy_timeout_ms=busy_timeout_ms,
            create=create,
            recover=recover,
            rebind=rebind,
            read_only=read_only,
            store=store,
        )
    path = Path(root).expanduser().resolve()
    url = catalog_url or default_catalog_url(path)
    dialect_of(url)  # an unsupported database is refused before anything is created
    blobs = local_pool_store(path) if store is None else store
    if not (recover or rebind):
        missing = _missing_catalog(path, url, blobs)
        if missing is not None:
            raise missing
    reason = "it was opened read-only" if read_only else None
    if read_only is None and path.is_dir():
        reason = _unwritable(path)
    if reason is not None and (recover or rebind):
        what = "recover" if recover else "rebind"
        raise ReadOnlyPoolError(f"{what} writes the pool, which is read-only here ({reason})")
    if reason is not None:
        if read_only is None and create and not pool_exists(path, catalog_url):
            # Asked to create, not only to read: "no pool (a read-only open never creates
            # one)" sent `init`'s user looking for a pool instead of for write access.
            raise ReadOnlyPoolError(f"cannot create a pool at {path}: {reason}")
        return _open_read_only(
            path,
            url,
            catalog_url=catalog_url,
            reason=reason,
            busy_timeout_ms=busy_timeout_ms,
            store=store,
        )
    # recover=True: this open writes next, so a SQLite catalog whose writer died leaving
    # only its log is recovered to tell (docs/architecture/shared-pools.md, "Shared pools").
    if not (create or recover or rebind) and not pool_exists(path, catalog_url, recover=True):
        damaged = _damaged_sqlite_file(url)
        if damaged is not None:
            raise PoolNotFoundError(
                f"no pool at {path}: the catalog file {damaged} is not a usable SQLite "
                "database (truncated or corrupt?); restore it from a backup or rebuild it "
                "from the manifests ('archive-manager rebuild-catalog')"
            )
        raise PoolNotFoundError(
            f"no pool at {path}; create one first (ArchiveManager.open or 'archive-manager init')"
        )
    if recover and read_identity(path) is None and not _has_blobs(blobs):
        # Checked before anything is created: a mistyped root must stay as it was.
        raise PoolNotFoundError(
            f"nothing to recover at {path}: it holds no pool identity and no blobs"
        )
    if rebind and read_identity(path) is None:
        raise PoolIdentityError(
            f"there is no pool to rebind at {path}: it has no pool identity file "
            f"({IDENTITY_FILE}); rebind a complete copy of a pool"
        )
    if rebind:
        _own_sqlite_catalog(url)
    else:
        # Before the catalog is opened (it may migrate): a copy's open writes nothing.
        catalog_file = sqlite_path(url)
        if catalog_file is not None:
            check_sqlite_copy(path, catalog_file)
    made = _missing_folders(path)
    path.mkdir(parents=True, exist_ok=True)
    for folder in reversed(made):
        # As every folder below it: a umask 077 in a setgid group folder made the root
        # 2700, and the group was locked out of a pool `verify` called shared.
        share_like_parent(folder)
    if store is None:
        # Made again now that the root exists, so that the store has seen it: a store
        # never makes a root it saw again (the pool moved or unmounted while open).
        blobs = local_pool_store(path)
    made_catalog = _absent_sqlite_file(url) if recover else None
    # None: a catalog this process may not write (a SQLite file or folder, a PostgreSQL
    # role that may only read) opens read-only even where the blob root is writable.
    try:
        catalog = Catalog.open(
            url, busy_timeout_ms=busy_timeout_ms, read_only=None if read_only is None else False
        )
    except BaseException:
        remove_sqlite_files(made_catalog)
        raise
    if catalog.read_only:
        catalog.close()
        if recover or rebind:
            what = "recover" if recover else "rebind"
            raise ReadOnlyPoolError(
                f"{what} writes the pool, whose catalog is read-only here "
                f"({catalog.read_only_reason})"
            )
        if not pool_exists(path, catalog_url):
            raise ReadOnlyPoolError(
                f"cannot create a pool at {path}: its catalog is read-only here "
                f"({catalog.read_only_reason})"
            )
        return _open_read_only(
            path,
            url,
            catalog_url=catalog_url,
            reason=catalog.read_only_reason or "read-only",
            busy_timeout_ms=busy_timeout_ms,
            store=store,
        )
    try:
        identity = bind_pool(
            catalog,
            path,
            url=url,
            explicit_url=catalog_url is not None,
            list_blobs=lambda n: list(itertools.islice(blobs.iter_digests(), n)),
            clock=clock or time.time,
            recover=recover,
            rebind=rebind,
        )
    except BaseException:
        Opened(path, catalog, blobs, None, made_catalog, made).abandon()
        raise
    return Opened(path, catalog, blobs, identity, made_catalog, made, adopt_journal=True)


def _open_object_store(
    url: str,
    catalog_url: str | None,
    *,
    clock: Callable[[], float] | None,
    busy_timeout_ms: int | None,
    create: bool,
    recover: bool,
    rebind: bool,
    read_only: bool | None,
    store: AbstractBlobStore | None,
) -> Opened:
    """`open` for a pool on an S3-compatible object store (docs/architecture/object-stores.md,
    "Blobs on an object store"): the identity and the retention journal are objects under the
    prefix, the catalog is wherever ``catalog_url`` says (never in the bucket)."""
    from ..blobs.s3 import S3BlobStore, parse_s3_url

    bucket, prefix = parse_s3_url(url)  # a malformed URL is refused before any request
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if catalog_url is None:
        raise InvalidInputError(
            f"a pool on an object store ({url}) needs an explicit catalog: pass "
            "catalog_url (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL), a PostgreSQL URL "
            "or a SQLite file outside the bucket; a SQLite file cannot live in a bucket"
        )
    dialect_of(catalog_url)
    if rebind:
        raise InvalidInputError(
            f"rebind is not supported for a pool on an object store ({url}): a bucket "
            "copy keeps the original's identity; open the copy with a new, empty catalog "
            "and recover=True instead"
        )
    if store is None:
        blobs: AbstractBlobStore = S3BlobStore.from_url(url)
    elif _s3_store_of(store, url):
        blobs = store  # a store configured by the caller (endpoint, timeouts, retries)
    else:
        raise InvalidInputError(
            f"the root {url} takes no store, or an S3BlobStore of that bucket and prefix"
        )
    root: ObjectRoot = blobs.pool_root()  # type: ignore[attr-defined]
    made_catalog: Path | None = None
    if read_only is True:
        if not pool_exists(url, catalog_url):
            raise PoolNotFoundError(f"no pool at {url} (a read-only open never creates one)")
        catalog = Catalog.open(
            catalog_url,
            busy_timeout_ms=busy_timeout_ms,
            read_only=True,
            read_only_reason="it was opened read-only",
        )
    else:
        if not (create or recover) and not pool_exists(url, catalog_url):
            raise PoolNotFoundError(
                f"no pool at {url} with the catalog {shown_url(catalog_url)}; create one "
                "first (ArchiveManager.open or 'archive-manager init')"
            )
        if recover and read_identity(root) is None and not _has_blobs(blobs):
            raise PoolNotFoundError(
                f"nothing to recover at {url}: it holds no pool identity and no blobs"
            )
        made_catalog = _absent_sqlite_file(catalog_url) if recover else None
        try:
            catalog = Catalog.open(
                catalog_url, busy_timeout_ms=busy_timeout_ms, read_only=read_only
            )
        except BaseException:
            remove_sqlite_files(made_catalog)
            raise
    try:
        # reads `blobs` when called: the read-only copy below, if one is made
        list_blobs = lambda n: list(itertools.islice(blobs.iter_digests(), n))  # noqa: E731
        if catalog.read_only:
            if recover:
                raise ReadOnlyPoolError(
                    f"recover writes the pool, whose catalog is read-only here "
                    f"({catalog.read_only_reason})"
                )
            # The second gate, as on a folder: pool.store and pool.root refuse writes
            # too (a view: a store passed in stays writable).
            if not blobs.read_only:
                blobs = blobs.read_only_view(catalog.read_only_reason or "read-only", where=url)
            root = blobs.pool_root()  # type: ignore[attr-defined]
            identity = check_pool_read_only(catalog, root, url=catalog_url, list_blobs=list_blobs)
        else:
            identity = bind_pool(
                catalog,
                root,
                url=catalog_url,
                explicit_url=True,
                list_blobs=list_blobs,
                clock=clock or time.time,
                recover=recover,
            )
    except BaseException:
        Opened(root, catalog, blobs, None, made_catalog).abandon()
        raise
    return Opened(root, catalog, blobs, identity, made_catalog, adopt_journal=not catalog.read_only)


def _open_catalog_only(
    root: str | os.PathLike[str],
    catalog_url: str | None,
    *,
    busy_timeout_ms: int | None,
    store: AbstractBlobStore | None,
) -> Opened:
    """`open` with ``catalog_only``: the catalog, read-only, and a store that refuses
    writes and has sent nothing yet (see `open`)."""
    reason = "it was opened to read the catalog only"
    where: Path | ObjectRoot
    if is_s3_url(root):
        from ..blobs.s3 import S3BlobStore, parse_s3_url

        bucket, prefix = parse_s3_url(str(root))
        url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        if catalog_url is None:
            raise InvalidInputError(
                f"a pool on an object store ({url}) needs an explicit catalog: pass "
                "catalog_url (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL)"
            )
        if store is None:
            # check_bucket=False: no request until a blob is read.
            s3: AbstractBlobStore = S3BlobStore.from_url(url, check_bucket=False)
        elif _s3_store_of(store, url):
            s3 = store
        else:
            raise InvalidInputError(
                f"the root {url} takes no store, or an S3BlobStore of that bucket and prefix"
            )
        blobs: AbstractBlobStore = s3 if s3.read_only else s3.read_only_view(reason, where=url)
        where = blobs.pool_root()  # type: ignore[attr-defined]  # its writes are refused
        catalog_url_used, shown = catalog_url, url
    else:
        path = Path(root).expanduser().resolve()
        catalog_url_used = catalog_url or default_catalog_url(path)
        blobs = _read_only_store(store, path, reason)
        where, shown = path, str(path)
    dialect_of(catalog_url_used)
    if not pool_exists(root, catalog_url):
        raise PoolNotFoundError(f"no pool at {shown} (a read-only open never creates one)")
    catalog = Catalog.open(
        catalog_url_used,
        busy_timeout_ms=busy_timeout_ms,
        read_only=True,
        read_only_reason=reason,
    )
    try:
        if not isinstance(where, Path):
            # NOTE: no request is sent here, so the store cannot say whether this prefix
            # holds the pool: a catalog recording another one answered for any prefix
            # (a typo listed the pool's archives).  A pool moved to another prefix is
            # followed by an open that uses the store.
            with catalog.read() as conn:
                recorded = get_pool_info(conn, "blob_root")
            if recorded is not None and recorded != shown:
                raise PoolIdentityError(
                    f"the catalog {safe_url(catalog_url_used)} records the pool at "
                    f"{recorded}, not {shown}: nothing was read; give --root {recorded} "
                    "(if the pool was moved here, run a verb that reads blobs, such as "
                    "'verify', once: it follows the move)"
                )
    except BaseException:
        catalog.close()
        raise
    return Opened(where, catalog, blobs, None)


def _open_read_only(
    path: Path,
    url: str,
    *,
    catalog_url: str | None,
    reason: str,
    busy_timeout_ms: int | None,
    store: AbstractBlobStore | None = None,
) -> Opened:
    """`open` for a reader: nothing is created, migrated, bound or repaired."""
    if not pool_exists(path, catalog_url):
        raise PoolNotFoundError(f"no pool at {path} (a read-only open never creates one)")
    catalog = Catalog.open(
        url, busy_timeout_ms=busy_timeout_ms, read_only=True, read_only_reason=reason
    )
    try:
        # The second gate, as on S3: the store is seen through a view that refuses
        # writes (a store given by the caller stays writable); pool.store writes nothing.
        blobs = _read_only_store(store, path, reason)
        identity = check_pool_read_only(
            catalog,
            path,
            url=url,
            list_blobs=lambda n: list(itertools.islice(blobs.iter_digests(), n)),
        )
    except BaseException:
        catalog.close()
        raise
    return Opened(path, catalog, blobs, identity)


def pool_exists(
    root: str | os.PathLike[str], catalog_url: str | None = None, *, recover: bool = False
) -> bool:
    """Whether a pool is at ``root`` (its catalog exists and was set up), creating nothing
    and changing no file (a SQLite file is only read, see `catalog.probe`).

    ``recover``: the caller opens the pool for writing next, so a SQLite catalog whose
    writer died leaving a log with commits and no ``-shm`` may be recovered (by SQLite,
    content unchanged) to tell; without it, or without write access, such a catalog
    raises `CatalogError`, since its file alone does not say."""
    status = catalog_status(root, catalog_url, recover=recover)
    return status.current is not None


def catalog_status(
    root: str | os.PathLike[str], catalog_url: str | None = None, *, recover: bool = False
) -> CatalogStatus:
    """The catalog's Alembic revision and this library's head, without migrating or
    creating anything (``recover``: see `exists`)."""
    if is_s3_url(root):
        if catalog_url is None:
            return CatalogStatus(None, head_revision())  # no catalog can be in a bucket
        url = catalog_url
    else:
        url = catalog_url or default_catalog_url(Path(root).expanduser().resolve())
    if parse_url(url).get_backend_name() == "sqlite":
        # NOTE: never through the engine, whose first connection switches the file to
        # WAL mode: asking must leave a file that is no catalog exactly as it was.
        file = sqlite_path(url)
        probe = probe_sqlite_catalog(file, recover=recover) if file is not None else None
        revision = probe.revision if probe is not None else None
        return CatalogStatus(revision, head_revision())
    engine = make_engine(url)
    try:
        return CatalogStatus(current_revision(engine), head_revision())
    except sa_exc.SQLAlchemyError as exc:
        raise CatalogError(f"cannot read the catalog at {shown_url(url)}: {exc}") from exc
    finally:
        engine.dispose()


def _missing_catalog(root: Path, url: str, store: AbstractBlobStore) -> PoolIdentityError | None:
    """The error for a SQLite catalog file that is gone while its blob root holds a pool.

    NOTE: checked before the catalog is opened, which would create an empty file: a refused
    open must leave the pool as it was.  (A PostgreSQL database has no such cheap test;
    there the identity check refuses the empty catalog after it was set up.)
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    if Path(parsed.database).exists() or not root.is_dir():
        return None
    identity = read_identity(root)
    if identity is None and not _has_blobs(store):
        return None
    held = f"pool {identity.pool_id[:12]}" if identity is not None else "blobs"
    return PoolIdentityError(
        f"the catalog {safe_url(url)} is missing, but the blob root {root} holds {held}: if "
        "the catalog was lost, run 'archive-manager rebuild-catalog' (ArchiveManager.open(root, "
        "recover=True), then rebuild_catalog()); if the pool's catalog is elsewhere, pass its "
        "URL (--catalog-url / $ARCHIVE_MANAGER_CATALOG_URL)"
    )


def _absent_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite catalog ``url`` that does not exist (yet); None otherwise."""
    file = sqlite_path(url)
    return file if file is not None and not os.path.lexists(file) else None


def remove_sqlite_files(file: Path | None) -> None:
    """Remove a SQLite catalog file this process made, with its ``-wal``/``-shm``/``-journal``."""
    if file is None:
        return
    for path in (file, *(file.with_name(file.name + end) for end in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _own_sqlite_catalog(url: str) -> None:
    """Before a rebind writes a SQLite catalog: its file must be the copy's own.

    NOTE: a hard-linked copy (``cp -al``, ``rsync --link-dest``, rsnapshot) shares each
    file's inode with the original, and SQLite writes its file in place: the rebind rewrote
    the original's catalog through the copy's name, and the original then refused to open.
    A linked file is replaced by a copy of it (SQLite's backup, checked, renamed into place);
    the rest of the pool is safe as it is (identity and journal files are replaced by
    rename, blobs never written again).  A linked ``-wal`` or ``-shm`` (the copy was made
    while the original was open) is refused: the copy's catalog is then the original's live
    database, not a copy of it.

    Raises:
        PoolIdentityError: a linked ``-wal``/``-shm``/``-journal``, or a copy that fails
            SQLite's check (the original was being written).
    """
    import sqlite3

    file = sqlite_path(url)
    if file is None or not file.is_file():
        return
    for side in ("-wal", "-shm", "-journal"):
        other = Path(f"{file}{side}")
        if other.is_file() and other.stat().st_nlink > 1:
            raise PoolIdentityError(
                f"{other} is a hard link shared with another file ({other.stat().st_nlink} "
                "names: a copy made with 'cp -al' or 'rsync --link-dest' while the original "
                "was open): the copy's catalog is the original's live database, and a rebind "
                "would rewrite it. Nothing was written; copy the pool again with the original "
                "closed (or back its catalog up with sqlite3's .backup), then rebind"
            )
    info = file.stat()
    if info.st_nlink <= 1:
        return
    _log.info("rebind: %s has %d names (a hard-linked copy): copying it", file, info.st_nlink)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.rebind.tmp")
    side_files = {Path(f"{file}{side}") for side in ("-wal", "-shm")}
    had = {p for p in side_files if p.exists()}
    try:
        source = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
        try:
            target = sqlite3.connect(tmp)
            try:
                source.backup(target)
                ok = target.execute("PRAGMA quick_check").fetchone()
            finally:
                target.close()
        finally:
            source.close()
        if ok != ("ok",):
            raise PoolIdentityError(
                f"{file} is a hard link shared with another pool's catalog, and a copy of it "
                f"did not pass SQLite's check ({ok}): it was being written. Nothing was "
                "written; close the original pool and run rebind again"
            )
        os.chmod(tmp, stat.S_IMODE(info.st_mode))
        with contextlib.suppress(OSError):
            os.chown(tmp, -1, info.st_gid)  # a group-shared pool's catalog stays shared
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, file)
        fsync_dir(file.parent)
    except sqlite3.Error as exc:
        raise PoolIdentityError(
            f"{file} is a hard link shared with another pool's catalog and could not be "
            f"copied ({exc}): nothing was written"
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # The read-only connection's own -wal and -shm, made for the old file.
        for made in side_files - had:
            with contextlib.suppress(FileNotFoundError):
                made.unlink()


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist, innermost first."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _damaged_sqlite_file(url: str) -> Path | None:
    """The SQLite catalog file if it is there but damaged (truncated, overwritten)."""
    if parse_url(url).get_backend_name() != "sqlite":
        return None
    file = sqlite_path(url)
    if file is None:
        return None
    try:
        damaged = probe_sqlite_catalog(file).kind == "not-sqlite"
    except CatalogError:
        damaged = True
    return Path(file) if damaged else None


def _s3_store_of(store: AbstractBlobStore, url: str) -> bool:
    """Whether ``store`` is an S3 store of ``url``, or a read-only view of one (a reader's
    ``pool.store`` passed to another read-only open)."""
    from ..blobs.s3 import S3BlobStore

    shown = store.store if isinstance(store, ReadOnlyView) else store
    return isinstance(shown, S3BlobStore) and shown.url == url


def _read_only_store(store: AbstractBlobStore | None, path: Path, reason: str) -> AbstractBlobStore:
    """The store of a pool on a folder opened read-only: ``store`` (else the folder's own)
    seen through a view that refuses every write; a store that refuses writes already is
    used as it is."""
    blobs = local_pool_store(path) if store is None else store
    return blobs if blobs.read_only else blobs.read_only_view(reason, where=path)


def _unwritable(root: Path) -> str | None:
    """Why this process cannot write the pool at ``root`` (None: it can, as far as the
    folders tell; the catalog is asked by `Catalog.open`)."""
    # NOTE: access(2) answers EROFS for W_OK on a read-only mount even to root, whom
    # permission bits never stop.
    for folder in (root, root / "blobs", root / "tmp", root / JOURNAL_DIR):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            try:
                mount_read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
            except OSError:
                mount_read_only = False
            if mount_read_only:
                return f"{folder} is on a read-only mount"
            return f"this process may not write {folder}"
    return _fuse_read_only(root)


def _fuse_read_only(root: Path) -> str | None:
    """Why ``root`` is read-only if it is on a FUSE filesystem that refuses writes itself.

    NOTE: a FUSE client mounted read-only (``juicefs mount --read-only``, ``s3fs -o ro``...)
    may leave the kernel's mount read-write: statvfs shows no ST_RDONLY and access(2) says
    "writable"; only each write fails with EROFS (docs/architecture/shared-pools.md, "Shared
    pools").  A setattr that changes nothing (the folder's own times) is the cheapest request the
    client itself must answer; EPERM (someone else's folder) tells nothing and is no verdict.
    """
    table = read_mount_table()
    if table is None:
        return None
    fstype = filesystem_type(os.path.realpath(root), table)
    if fstype is None or not fstype.startswith("fuse."):
        return None
    try:
        st = os.stat(root)
        os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return f"{root} is on a read-only mount ({fstype} refuses writes)"
    return None


def _has_blobs(store: AbstractBlobStore) -> bool:
    return next(iter(store.iter_digests()), None) is not None
