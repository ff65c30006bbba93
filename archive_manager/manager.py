"""`ArchiveManager`: one storage pool (a catalog plus a blob root) and everything done to it."""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from ._util.constants import DEFAULT_INLINE_LIMIT, DEFAULT_SEARCH_TIMEOUT, default_catalog_url
from ._util.humanize import duration_seconds
from ._util.names import (
    archive_owner,
    check_archive_name,
    check_new_owner,
    check_owner,
    name_spellings,
)
from .blobs import AbstractBlobStore, local_pool_store
from .blobs.base import ObjectRoot
from .catalog import (
    Catalog,
    archives_table,
    entries_table,
    retention_table,
)
from .catalog.engine import (
    shown_url,
    sqlite_path,
)
from .catalog.queries import archive_by_name, archives_in_order, archives_named, stored_owner
from .errors import (
    ArchiveReleasedError,
    InvalidInputError,
    ReadOnlyPoolError,
)
from .pool.archive import (
    Archive,
    ArchiveInfo,
    infos,
    not_found,
    open_archive,
    reclaimed_names,
    release_archives,
)
from .pool.background import PastExit, register_exit_hook
from .pool.context import PoolContext
from .pool.identity import (
    PoolIdentity,
)
from .pool.journal import (
    Journal,
    adopt,
    journal_for,
    pool_id_of,
    release_owner_op,
    retain_op,
    stage_record,
    write_committed,
)
from .pool.listing import listing_filter, rollout_filter
from .pool.opening import (
    CatalogStatus,
    catalog_status,
    open_pool,
    pool_exists,
    remove_sqlite_files,
)

# NOTE: the modules that encode, decode, collect, verify or export (and so import the codec:
# numpy, zstandard), and those of one verb (stats, the RL lens, retention plans, the pool
# summary, .pt imports, group sharing), are imported by the methods that use them: opening
# a pool and reading its catalog needs none of them (docs/architecture/start-up.md, "Start-up").
if TYPE_CHECKING:
    from ._util.permissions import SharedReport
    from .lens.groups import Group, PromptChange, PromptRollout
    from .lens.query import PoolSummary, SampleRow, SampleRows
    from .lens.search import SearchResult
    from .lens.stats import RolloutStats, StatsCache
    from .pool.background import BackgroundSaves, SaveFuture
    from .pool.gc import GcReport
    from .pool.recovery import RebuildReport
    from .pool.retention import ForgetPlan, OwnersReport, ReleasePlan
    from .pool.verify import VerifyReport
    from .pool.writer import ArchiveWriter

__all__ = ["ArchiveManager", "CatalogStatus", "default_catalog_url"]

_log = logging.getLogger("archive_manager")

DEFAULT_LEASE_TTL = timedelta(minutes=5)
DEFAULT_CHUNK_SIZE = 64
_STATES = ("pending", "published", "released")


def _grace_seconds(grace: object) -> float:
    """A GC grace period in seconds: a `timedelta`, a real number of seconds or the CLI's
    duration text (``"1h"``), between 0 and what a `timedelta` can hold (the CLI's limit too)."""
    try:
        return duration_seconds(grace, "grace")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


# A lease lives at most this long without renewal: beyond it a crashed writer would hold its
# blobs for weeks, and the heartbeat's waits would overflow the platform's time_t.
MAX_LEASE_TTL = 7 * 24 * 3600.0


def _seconds(value: timedelta | float) -> float:
    try:
        seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    except (OverflowError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"a duration in seconds was expected, not {value!r:.40}") from exc
    if not 0 < seconds <= MAX_LEASE_TTL:
        raise InvalidInputError(
            f"lease_ttl must be positive and at most {MAX_LEASE_TTL:.0f} s (7 days), "
            f"not {value!r:.40}"
        )
    return seconds


def _check_settings(chunk_size: object, inline_limit: object) -> None:
    """Refuse bad settings before a pool is opened (and perhaps created)."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidInputError("chunk_size must be a positive int")
    if not isinstance(inline_limit, int) or inline_limit < 0:
        raise InvalidInputError("inline_limit must be an int >= 0")


# `import_pt`'s "take it from the file" default, told apart from an explicit None.
_FROM_FILE: Any = object()


class ArchiveManager:
    """A storage pool: immutable, indexed archives of rollout samples.

    Open one with `ArchiveManager.open`; it is a context manager.  Several processes may open
    the same pool at once.
    """

    def __init__(
        self,
        root: Path | ObjectRoot,
        catalog: Catalog,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl: timedelta | float = DEFAULT_LEASE_TTL,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        store: AbstractBlobStore | None = None,
    ) -> None:
        """Wrap an open catalog and blob root; use `ArchiveManager.open` instead."""
        _check_settings(chunk_size, inline_limit)
        self._root = root
        self._stats_cache: StatsCache | None = None  # made by the first `stats`
        self._background: BackgroundSaves | None = None  # made by the first `save_async`
        # The SQLite catalog file a recover open made, until a rebuild into it completed.
        self._made_catalog: Path | None = None
        if store is None:
            if not isinstance(root, Path):
                raise InvalidInputError(f"the pool at {root} is on an object store: pass its store")
            store = local_pool_store(root)
        register_exit_hook()  # an interpreter exits after the saves save_async handed off
        # Everything below this facade takes the context, never the facade
        # (docs/architecture/index.md, "Layers"); `open` adds the identity once it is checked.
        self._context = PoolContext(
            root=root,
            catalog=catalog,
            store=store,
            journal=journal_for(root),
            clock=clock,
            lease_ttl=_seconds(lease_ttl),
            chunk_size=chunk_size,
            inline_limit=inline_limit,
        )

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        catalog_url: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        lease_ttl: timedelta | float = DEFAULT_LEASE_TTL,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        busy_timeout_ms: int | None = None,
        create: bool = True,
        recover: bool = False,
        rebind: bool = False,
        read_only: bool | None = None,
        store: AbstractBlobStore | None = None,
        catalog_only: bool = False,
    ) -> ArchiveManager:
        """Open the pool at ``root``, creating it (and migrating its catalog) if needed.

        Args:
            root: The blob root; created if missing.  ``s3://bucket/prefix``: a pool on an
                S3-compatible object store (docs/architecture/object-stores.md, "Blobs on an object
                store"), which needs ``catalog_url``.
            catalog_url: A SQLAlchemy URL; default ``sqlite:///<root>/catalog.db``.
            clock: Seconds since the epoch; injectable so tests of leases and grace periods
                need not wait.
            lease_ttl: How long a save in flight is protected without renewing its lease.
            chunk_size: Samples per chunk blob.
            inline_limit: Tensors and numeric numpy arrays larger than this many bytes
                become their own blobs (raw, mapped on load); smaller ones stay inside their
                chunk's records, compressed.
            busy_timeout_ms: How long to wait for another process's catalog lock.
            create: Create the pool if there is none; with False, a missing pool raises
                `PoolNotFoundError` (so a mistyped path never makes an empty pool).
            recover: The pool's catalog was lost: let this empty (or missing) catalog take
                over the blob root, keeping its pool identity; GC stays refused until
                `rebuild_catalog` has run.  Refused for a root with no identity and no blobs.
            rebind: ``root`` is a copy of a pool (``cp -a pool copy``, catalog inside it):
                bind its catalog to it and give the copy a new pool identity, so that copy
                and original are never taken for one another.
            read_only: Only read the pool: create, migrate and write nothing, not even a
                ``-wal``/``-shm`` or temp file; every write (save, release, retain, gc,
                rebuild) raises `ReadOnlyPoolError` before it changes anything
                (docs/architecture/shared-pools.md, "Shared pools").  None (the default): read-only
                when this process cannot write an existing pool (a read-only mount, no write
                permission on its folders or catalog file, a PostgreSQL role that may only read).
            store: Where the blobs are kept: any `AbstractBlobStore`
                (docs/architecture/blob-store-contract.md, "Blob store contract"); default the
                filesystem store under ``root``, its reads retried on a shared filesystem
                (`blobs.local_pool_store`; a store passed in is used as given).  The pool
                identity file and a default SQLite catalog stay in ``root``.
            catalog_only: Only the catalog will be read (listings, queries, statistics,
                owners): open it read-only and touch nothing at the blob root, no identity
                file and no journal (on an object store: not one request), so a store that
                does not answer cannot hold these up.  The pool is read-only (every write
                raises `ReadOnlyPoolError`: the pool's identity was not checked, so no write
                may go through it); a load still reads its blobs (an object store's calls
                then have their deadline).  `identity` is None.

        Raises:
            PoolNotFoundError: ``create`` is False and there is no pool (or, with
                ``recover``, nothing to recover); with ``read_only``, no pool (a reader
                never creates one).
            ReadOnlyPoolError: ``read_only`` with ``recover`` or ``rebind``, which write; or
                there is no pool and this process may not write the folder or the catalog
                to create one.
            CatalogVersionError: the pool was written by a newer archive_manager.
            PoolIdentityError: the catalog and the blob root are not one pool's (another
                pool's catalog, a copy, a root re-bound to another catalog); the message
                names both sides and what to do.
            CatalogError: the catalog cannot be opened, or its URL names a database other
                than SQLite and PostgreSQL.
            InvalidInputError: ``store`` is not an `AbstractBlobStore`, or is a read-only
                pool's store (it refuses writes) and ``read_only`` is not True; or
                ``catalog_only`` with ``create``-only work (``recover``, ``rebind``,
                ``read_only=False``).
        """
        _check_settings(chunk_size, inline_limit)
        opened = open_pool(
            root,
            catalog_url,
            clock=clock,
            busy_timeout_ms=busy_timeout_ms,
            create=create,
            recover=recover,
            rebind=rebind,
            read_only=read_only,
            store=store,
            catalog_only=catalog_only,
        )
        try:
            pool = cls(
                opened.root,
                opened.catalog,
                clock=clock or time.time,
                lease_ttl=lease_ttl,
                chunk_size=chunk_size,
                inline_limit=inline_limit,
                store=opened.store,
            )
            pool._context = replace(pool._context, identity=opened.identity)
            pool._made_catalog = opened.made_catalog
            if opened.adopt_journal:
                adopt(opened.catalog, pool.journal, pool.clock)
            return pool
        except BaseException:
            opened.abandon()
            raise

    @staticmethod
    def exists(
        root: str | os.PathLike[str], catalog_url: str | None = None, *, recover: bool = False
    ) -> bool:
        """Whether a pool is at ``root`` (its catalog exists and was set up), creating nothing
        and changing no file (a SQLite file is only read, see `catalog.probe`).

        ``recover``: the caller opens the pool for writing next, so a SQLite catalog whose
        writer died leaving a log with commits and no ``-shm`` may be recovered (by SQLite,
        content unchanged) to tell; without it, or without write access, such a catalog
        raises `CatalogError`, since its file alone does not say."""
        return pool_exists(root, catalog_url, recover=recover)

    @staticmethod
    def catalog_status(
        root: str | os.PathLike[str], catalog_url: str | None = None, *, recover: bool = False
    ) -> CatalogStatus:
        """The catalog's Alembic revision and this library's head, without migrating or
        creating anything (``recover``: see `exists`)."""
        return catalog_status(root, catalog_url, recover=recover)

    # ------------------------------------------------------------------ pool

    @property
    def root(self) -> Path:
        """The blob root: a folder, or for a pool on an object store its `ObjectRoot`
        (``str(pool.root)`` is then ``s3://bucket/prefix``)."""
        return self._root  # type: ignore[return-value]

    @property
    def identity(self) -> PoolIdentity | None:
        """The pool's identity (pool id and catalog id) as checked when it was opened."""
        return self._context.identity

    @property
    def context(self) -> PoolContext:
        """What the operations below this facade are given: the catalog, the blob store,
        the journal, the clock and the settings of this open pool (`PoolContext`)."""
        return self._context

    @property
    def catalog(self) -> Catalog:
        """The pool's catalog."""
        return self._context.catalog

    @property
    def store(self) -> AbstractBlobStore:
        """The pool's blob store."""
        return self._context.store

    @property
    def journal(self) -> Journal:
        """The pool's retention journal (docs/architecture/retention-journal.md, "Retention
        journal")."""
        return self._context.journal

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds since the epoch, as this pool reads them."""
        return self._context.clock

    @property
    def lease_ttl(self) -> float:
        """How long, in seconds, a save in flight is protected without renewing its lease."""
        return self._context.lease_ttl

    @property
    def chunk_size(self) -> int:
        """Samples per chunk blob."""
        return self._context.chunk_size

    @property
    def inline_limit(self) -> int:
        """Tensors larger than this many bytes become their own blobs."""
        return self._context.inline_limit

    @property
    def catalog_url(self) -> str:
        """The catalog's SQLAlchemy URL."""
        return self.catalog.url

    @property
    def read_only(self) -> bool:
        """True when the pool is only read here (every write raises `ReadOnlyPoolError`)."""
        return self.catalog.read_only

    @property
    def read_only_reason(self) -> str | None:
        """Why the pool is only read here (asked for, a read-only mount, ...), or None."""
        return self.catalog.read_only_reason

    def _refuse_if_read_only(self, what: str) -> None:
        # An early exit for verbs that would read much before their first catalog write;
        # the guarantee itself is `Catalog.write`'s gate.
        if self.read_only:
            raise ReadOnlyPoolError(
                f"the pool at {self._root} is read-only here ({self.read_only_reason}): "
                f"{what} is refused; nothing was changed"
            )

    def share_with_group(self, group: str | int) -> SharedReport:
        """Let every account of ``group`` save into, release from and collect this pool.

        Folders get the group, its write bit and the set-group-id bit (new folders inherit
        the group, and `BlobStore` gives them the group's write bit); the SQLite catalog file
        (and its ``-wal``/``-shm``) gets the group's read and write bits; blob files stay
        read-only for everyone.  Idempotent: run it again to repair what `verify` reports
        (docs/architecture/shared-pools.md, "Shared pools").

        Raises:
            InvalidInputError: no such group.
            ReadOnlyPoolError: the pool is open read-only.
            OSError: a file could not be changed (this account neither owns it nor is root).
        """
        from ._util.permissions import share_pool

        self._refuse_if_read_only("sharing the pool with a group")
        if not isinstance(self._root, Path):
            raise InvalidInputError(
                f"the pool at {self._root} is on an object store: its access is the bucket's "
                "policy, not a group's bits"
            )
        return share_pool(self._root, group, catalog_file=sqlite_path(self.catalog_url))

    def close(self) -> None:
        """Wait for the saves `save_async` handed off, then release the catalog's
        connections; idempotent.

        Raises:
            Exception: the error of a background save whose future nobody looked at (the
                first, with a note naming it and any other); the catalog is closed all the
                same.
        """
        failure = None
        if self._background is not None:
            failure = self._background.close()
        self.catalog.close()
        if failure is not None:
            raise failure

    def __enter__(self) -> ArchiveManager:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        # The block's own error goes on: a background failure nobody looked at is logged
        # instead of replacing it.
        try:
            self.close()
        except Exception:
            _log.error("a background save failed while the pool was closed", exc_info=True)

    def __repr__(self) -> str:
        return f"ArchiveManager({str(self._root)!r}, catalog_url={shown_url(self.catalog_url)!r})"

    # ------------------------------------------------------------------ saving

    def save(
        self,
        name: str,
        samples: Sequence[Any] | None,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        task_keys: Sequence[Any] | None = None,
        attrs: dict[str, Any] | None = None,
        reference: Archive | str | None = None,
        supersede: bool = False,
        reward_key: str | None = None,
    ) -> Archive:
        """Save ``samples`` as a new published archive ``name``.

        With ``reference`` (an `Archive` or a name), ``samples`` must be None and the new
        archive shares the referenced archive's chunks without copying them.

        ``supersede=True`` saves a step again under a name whose archive was released (a run
        resumed from an earlier checkpoint regenerating it): once this save publishes, the
        name points at it, and the earlier archive stays on record as ``superseded`` (its
        id, rows and journal kept; `history` lists it) and counts nowhere (statistics,
        queries, groups, listings, the viewer).  Without it, a released name whose payload
        gc reclaimed is taken back the same way; a released one whose payload is still
        stored, or a published one, is refused.  A save killed at any point leaves the
        earlier archive or the new one current, never neither (docs/architecture/save-protocol.md,
        "Superseding a name").

        ``reward_key`` names the part of a dict reward that is each sample's reward (slime's
        ``--reward-key``: ``{"score": 1.0, "acc": True}`` with ``"score"``); a reward that is
        a number stays the reward.  It is kept with the archive (`Archive.reward_key`, its
        manifest) and used by `stats`, `query` and `groups` unless they are given another;
        every numeric part of a dict reward is recorded, so another can be chosen later.
        A reference save keeps its source's key unless given one.

        Raises:
            SaveInFlightError: a save of that name is in flight, or crashed where this process
                cannot tell (the message names its holder and when its lease lapses).
            ArchiveRetainedError: the archive the name points at is retained (published, or
                held by other owners: the message names them); nothing is written.
            ArchiveExistsError: the name is taken (published, or released with its payload
                still stored and ``supersede`` not given: the message says so); nothing is
                written.
            InvalidNameError, InvalidInputError, UnencodableError: bad input (the pool is left
                as it was).
            OSError: a blob could not be written (ENOSPC, EROFS, EACCES, EIO, ...), raised
                unchanged; the save is rolled back and the pool left as it was.
            CatalogLockedError, CatalogError: the catalog stayed locked past the busy
                timeout, or could not be written (a full disk); if the catalog was
                unreachable even to roll back, the save's lease expires and GC clears
                what it wrote.
        """
        from .pool.writer import ArchiveWriter, save_samples

        if reference is not None:
            if samples is not None:
                raise InvalidInputError("give either samples or reference, not both")
            if task_keys is not None:
                raise InvalidInputError("a reference archive keeps its source's task keys")
            source = reference if isinstance(reference, Archive) else self.open_archive(reference)
            if source._pool is not self._context and source._pool.catalog_url != self.catalog_url:
                raise InvalidInputError("a reference must be an archive of the same pool")
            writer = ArchiveWriter(
                self._context,
                name,
                rollout_id=rollout_id,
                evaluation=evaluation,
                attrs=attrs,
                reference=source,
                supersede=supersede,
                reward_key=reward_key,
            )
            return writer.commit()
        if samples is None:
            raise InvalidInputError("samples is None and no reference was given")
        return save_samples(
            self._context,
            name,
            samples,
            rollout_id=rollout_id,
            evaluation=evaluation,
            task_keys=task_keys,
            attrs=attrs,
            supersede=supersede,
            reward_key=reward_key,
        )

    def save_async(
        self,
        name: str,
        samples: Sequence[Any] | None,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        task_keys: Sequence[Any] | None = None,
        attrs: dict[str, Any] | None = None,
        reference: Archive | str | None = None,
        supersede: bool = False,
        reward_key: str | None = None,
    ) -> SaveFuture:
        """`save`, handed to a background thread: returns a `concurrent.futures.Future` that
        resolves to the archive `save` returns, or fails with the error `save` raises.

        The samples are taken when this is called: each is copied on the caller's thread as
        far as the caller could change it (its numeric lists as the arrays the codec stores,
        on several threads; lists, dicts, tensors and arrays; `codec.snapshot`), so the
        caller may reuse or change the samples, their dicts, lists, tensors and arrays as
        soon as this returns.  The encoding and the save itself (blobs, ownership, manifest,
        publication) then run on the pool's worker thread, one save at a time in the order
        they were handed over, under the save protocol unchanged: a process killed before a
        save published leaves nothing visible.

        Bytes in flight are bounded by `save_async_budget`: past it, this waits until the
        worker has taken enough (backpressure).  A failure is set on the future; one whose
        future nobody looked at is raised again by `close` (and the end of a ``with``
        block).  `close` waits for the saves in flight, and so does an interpreter that exits
        with some in flight.  See docs/usage.md, "Saving in the background".

        Raises:
            ArchiveError: the pool is closed (every other error is the future's).
            ReadOnlyPoolError: the pool was opened read-only.
        """
        self._refuse_if_read_only("saving")
        saves = self._background_saves()

        def now() -> Archive:
            return self.save(
                name,
                samples,
                rollout_id=rollout_id,
                evaluation=evaluation,
                task_keys=task_keys,
                attrs=attrs,
                reference=reference,
                supersede=supersede,
                reward_key=reward_key,
            )

        try:
            return saves.submit(
                name,
                samples,
                rollout_id=rollout_id,
                evaluation=evaluation,
                task_keys=task_keys,
                attrs=attrs,
                supersede=supersede,
                direct=now if reference is not None else None,
                reward_key=reward_key,
            )
        except PastExit:
            pass
        # The interpreter is ending (the exit hook began): no worker would be waited for,
        # and the exit must not wait for saves without end, so this one is saved here
        # (outside the `except`: its failure chains no `PastExit`) and its future is done.
        return saves.run_here(name, now)

    @property
    def save_async_budget(self) -> int:
        """Bytes of samples `save_async` may hold, taken, waiting for the worker (1 GiB by
        default); a call that would exceed it waits.  Settable."""
        from .pool.background import DEFAULT_BUDGET

        return DEFAULT_BUDGET if self._background is None else self._background.budget

    @save_async_budget.setter
    def save_async_budget(self, value: int) -> None:
        self._background_saves().budget = value

    def _background_saves(self) -> BackgroundSaves:
        from .pool.background import BackgroundSaves

        if self._background is None:
            self._background = BackgroundSaves(self._context)
            # A pool dropped without close: its saves go on; a failure nobody looked at is
            # logged when it is collected (or at exit).
            weakref.finalize(self, self._background.abandoned)
        return self._background

    def writer(
        self,
        name: str,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        attrs: dict[str, Any] | None = None,
        supersede: bool = False,
        reward_key: str | None = None,
    ) -> ArchiveWriter:
        """A streaming writer: ``with pool.writer(...) as w: w.add(sample, task_key=...)``.

        Memory stays bounded (one chunk being built, at most two compressed or being
        stored); the archive is published on a clean exit of the ``with`` block and rolled
        back on an exception.  ``supersede`` is `save`'s.
        Errors are those of `save` (an `OSError` of the blob store surfaces from ``add`` or
        at the end of the block).
        """
        from .pool.writer import ArchiveWriter

        return ArchiveWriter(
            self._context,
            name,
            rollout_id=rollout_id,
            evaluation=evaluation,
            attrs=attrs,
            supersede=supersede,
            reward_key=reward_key,
        )

    # ------------------------------------------------------------------ reading

    def open_archive(self, name: str) -> Archive:
        """The published or released archive ``name`` (reads the catalog only).

        Raises:
            ArchiveNotFoundError: no such archive, or it is still pending.
        """
        return open_archive(self._context, name)

    def find(
        self,
        rollout_id: int | range | tuple[int | None, int | None] | None = None,
        evaluation: bool | None = None,
        task_key: str | None = None,
        state: str | None = "published",
        since: datetime | None = None,
        *,
        rollout_ids: int | range | tuple[int | None, int | None] | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[ArchiveInfo]:
        """Archives matching every filter given, by rollout id (archives without one last)
        then name.

        ``rollout_ids`` (the name `query`, `stats`, the datasets and the exports use; the
        older ``rollout_id`` means the same) is one id, a ``range`` or an inclusive
        ``(low, high)`` with optional ends (the CLI's ``A..B``, ``A..``, ``..B``).

        ``state=None`` means every state (pending saves, and the archives names pointed at
        before they were saved again, ``superseded``, included); ``since`` keeps archives
        created at or after that time (a naive datetime is local time).  ``limit`` returns
        at most that many; ``after`` (an archive's name, the last of the previous page)
        starts after that archive: keyset paging, as cheap on the last page as on the first
        (docs/architecture/summaries-and-paging.md, "Summaries and paging").  A name with several
        archives (its superseded ones, a save of it pending) is never split over two pages: a page
        ends before them, or holds them all when they alone exceed ``limit``.

        Raises:
            InvalidInputError: a filter of the wrong type or out of range.
        """
        f = listing_filter(
            rollout_id,
            evaluation,
            task_key,
            state,
            since,
            rollout_ids=rollout_ids,
            limit=limit,
            after=after,
        )
        a, e = archives_table, entries_table
        query = select(a)
        if f.rollout_low is not None:
            query = query.where(a.c.rollout_id >= f.rollout_low)
        if f.rollout_high is not None:
            query = query.where(a.c.rollout_id <= f.rollout_high)
        if f.evaluation is not None:
            query = query.where(a.c.evaluation == f.evaluation)
        if f.task_key is not None:
            # NOTE: an uncorrelated IN, read once from the (task_key, archive_id) index: as a
            # correlated EXISTS, SQLite probed each archive's entries by primary key once
            # they were a WITHOUT ROWID table (3 s at 10,000 archives;
            # docs/architecture/summaries-and-paging.md, "Summaries and paging").
            query = query.where(
                a.c.id.in_(select(e.c.archive_id).where(e.c.task_key == f.task_key))
            )
        if f.created_since is not None:
            query = query.where(a.c.created_at >= f.created_since)
        if f.state is not None:
            query = query.where(a.c.state == f.state)
        with self.catalog.read() as conn:
            start: tuple[int | None, str] | None = None
            if f.after is not None:
                row = archive_by_name(conn, f.after)
                if row is None:
                    raise not_found(conn, f.after)
                start = (row.rollout_id, row.name)
            rows = archives_in_order(conn, query, after=start, limit=f.limit)
        return infos(rows)

    def history(self, name: str) -> list[ArchiveInfo]:
        """Every archive the name ``name`` has pointed at, oldest first: those it superseded
        (state ``superseded``, with `ArchiveInfo.superseded_by` and ``superseded_at``), then
        the one it points at now, then a save of it in flight (pending), if any.  From the
        catalog alone (docs/architecture/save-protocol.md, "Superseding a name").

        Raises:
            ArchiveNotFoundError: no archive has had that name.
        """
        check_archive_name(name)
        with self.catalog.read() as conn:
            rows = archives_named(conn, name)
            if not rows:
                raise not_found(conn, name)
        # In the order the name pointed at them: the superseded ones by when they stopped
        # being current (ids need not follow it: a rebuild restores them after the current
        # one), the current one, then the pending save, which it does not point at yet.
        return infos(
            sorted(
                rows,
                key=lambda row: (
                    row.state != "superseded",
                    row.state == "pending",
                    row.superseded_at or 0.0,
                    row.id,
                ),
            )
        )

    def payload_reclaimed(self, names: Sequence[str]) -> set[str]:
        """Which of the archives ``names`` lost payload to GC (a blob they need is gone or
        being deleted): a released archive in it can no longer be loaded; one not in it
        still can, until GC runs.  Reads the catalog only."""
        if isinstance(names, str):
            raise InvalidInputError("names must be a list of archive names, not one str")
        with self.catalog.read() as conn:
            return reclaimed_names(conn, list(names))

    def info(self) -> PoolSummary:
        """A summary of the pool: archives by state, blobs, bytes stored and referenced,
        dedup ratio, format version and catalog revision."""
        from .lens.query import pool_summary

        return pool_summary(self._context)

    def query(
        self,
        *,
        task_key: str | None = None,
        sample_key: str | None = None,
        status: str | enum.Enum | Sequence[str | enum.Enum] | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        min_rollout_id: int | None = None,
        max_rollout_id: int | None = None,
        rollout_ids: range | tuple[int | None, int | None] | int | None = None,
        evaluation: bool | None = None,
        state: str | None = "published",
        limit: int | None = None,
        reward_key: str | None = None,
        rollout_id: range | tuple[int | None, int | None] | int | None = None,
    ) -> SampleRows:
        """Samples across archives, from the catalog alone, matching every filter given.

        ``status`` is one status or several (any of them), as text (``"truncated"``) or as
        ``Sample.Status`` members; ``min_length``/``max_length`` bound the response length;
        ``rollout_ids`` (an int, a ``range`` or an inclusive ``(low, high)`` with optional
        ends; ``rollout_id``, `find`'s older spelling, means the same) is the same filter as
        ``min_rollout_id``/``max_rollout_id``, which narrow it further; ``state`` is ``"published"`` by default, None for all.  ``reward_key``
        chooses the part of dict rewards read as the reward (the rows' ``reward`` and the
        reward bounds) instead of the key each archive was saved with, from the parts the
        catalog keeps: no payload is read (`archive_manager.lens.rewards`).

        The result is a list of `SampleRow` whose ``load()`` returns their samples (`load`).
        """
        from .lens.query import query_samples
        from .lens.stats import narrow_rollout_bounds

        min_rollout_id, max_rollout_id = narrow_rollout_bounds(
            rollout_filter(rollout_ids, rollout_id), min_rollout_id, max_rollout_id
        )
        return query_samples(
            self._context,
            task_key=task_key,
            sample_key=sample_key,
            status=status,
            min_reward=min_reward,
            max_reward=max_reward,
            min_length=min_length,
            max_length=max_length,
            min_rollout_id=min_rollout_id,
            max_rollout_id=max_rollout_id,
            evaluation=evaluation,
            state=state,
            limit=limit,
            reward_key=reward_key,
        )

    def load(
        self, rows: Iterable[SampleRow], *, as_arrays: bool = False, materialize: bool = False
    ) -> list[Any]:
        """The samples of ``rows`` (what `query` returned, or any iterable of its rows, from
        any number of archives), in the rows' order; each chunk holding one of them is read
        once.  ``pool.query(...).load()`` is the same.  ``as_arrays`` and ``materialize`` as
        in `Archive.load_samples`.

        Raises:
            InvalidInputError: ``rows`` holds something else than the rows `query` returns,
                or a row no longer matches its archive (the name holds another archive now).
            ArchiveNotFoundError: a row's archive no longer exists.
            ArchiveReleasedError: a row's archive was released and GC reclaimed its payload
                (checked before any blob is read).
            IntegrityError: a needed blob is missing or damaged.
        """
        from .lens.query import load_rows

        return load_rows(self._context, rows, as_arrays=as_arrays, materialize=materialize)

    def stats(
        self,
        rollout_ids: range | tuple[int | None, int | None] | int | None = None,
        evaluation: bool | None = None,
        *,
        limit: int | None = None,
        after: tuple[int | None, bool] | None = None,
        group_by: str | None = None,
        reward_key: str | None = None,
        rollout_id: range | tuple[int | None, int | None] | int | None = None,
    ) -> list[RolloutStats]:
        """Training-drift statistics per rollout id and evaluation flag, from the catalog.

        Per row: samples, mean / p50 / p90 reward, mean and p90 response length, share
        truncated and share by status, bytes; published and released archives count (see
        `archive_manager.lens.stats`).  ``rollout_ids`` is an int, a ``range`` or an inclusive
        ``(low, high)`` with optional ends (``rollout_id``, `find`'s older spelling, means
        the same).  Summaries of unchanged rollouts are cached.

        Rows come by rollout id (rollouts without one last), training before evaluation.
        ``limit`` returns at most that many; ``after`` (``(rollout_id, evaluation)`` of the
        last row of the previous page) starts after that row: keyset paging, reading only the
        page's archives (docs/architecture/summaries-and-paging.md, "Summaries and paging").

        The prompt-group figures count groups as `groups` does: by task key, else by
        ``group_index``; ``group_by`` names the one field to group by instead (as in
        `groups`), and the rows are then computed from every sample's catalog row (and, for
        a field the catalog does not hold, from that field decoded from the chunks) instead
        of the stored summaries.

        A reward is read with the key each archive was saved with (`save`'s ``reward_key``);
        ``reward_key`` reads another part of dict rewards, from the parts the catalog keeps
        (no payload is read; the rows of archives saved with another key are computed from
        their samples' catalog rows).  ``RolloutStats.unscored`` counts the samples whose
        reward is not a number and gave none (a dict without the key), and
        ``reward_components`` / ``reward_note`` say which keys there are to choose from.
        """
        from .lens.stats import StatsCache, rollout_stats

        if self._stats_cache is None:
            self._stats_cache = StatsCache()
        return rollout_stats(
            self._context,
            rollout_filter(rollout_ids, rollout_id),
            evaluation,
            cache=self._stats_cache,
            after=after,
            limit=limit,
            group_by=group_by,
            reward_key=reward_key,
        )

    # ------------------------------------------------------------------ the RL lens

    def groups(
        self, name: str, *, group_by: str | None = None, reward_key: str | None = None
    ) -> list[Group]:
        """The prompt groups of archive ``name``: per task key (else ``group_index``) its
        size, reward mean, std (``n - 1``), min and max, GRPO advantages per sample, mean
        length, statuses, and whether every reward is equal (`Group.zero_variance`).  From
        the catalog alone.

        ``group_by`` names the one field to group by instead: ``"task_key"``,
        ``"group_index"`` (from the catalog), or any field of the samples (``"label"``,
        ``"metadata.source_name"``), which is decoded from the archive's chunks, that field
        alone (`archive_manager.lens.grouping`).  ``reward_key`` reads another part of dict
        rewards than the archive's own key, from the catalog (as in `stats`).

        Raises:
            ArchiveNotFoundError: no such published or released archive.
            InvalidInputError: ``group_by`` is no field name, or a value of it keys no group.
            ArchiveReleasedError: ``group_by`` a payload field of a reclaimed archive.
        """
        from .lens.groups import group_summaries

        check_archive_name(name)
        return group_summaries(self._context, name, group_by=group_by, reward_key=reward_key)

    def prompt_history(
        self,
        task_key: str,
        rollout_ids: object = None,
        *,
        evaluation: bool | None = None,
        pass_threshold: float = 0.0,
    ) -> list[PromptRollout]:
        """How each rollout did on one prompt: group size, mean reward, pass rate (rewards
        above ``pass_threshold``), mean length, in rollout order.  From the catalog alone."""
        from .lens.groups import prompt_history

        return prompt_history(
            self.catalog,
            task_key,
            rollout_ids=rollout_ids,
            evaluation=evaluation,
            pass_threshold=pass_threshold,
        )

    def prompt_changes(
        self,
        before: object,
        after: object,
        *,
        evaluation: bool | None = None,
        direction: str | None = None,
        limit: int | None = None,
    ) -> list[PromptChange]:
        """Prompts seen in both rollout ranges, ranked by the change of their mean reward
        (``direction``: ``"regressed"``, ``"improved"`` or None for either way)."""
        from .lens.groups import prompt_changes

        return prompt_changes(
            self.catalog, before, after, evaluation=evaluation, direction=direction, limit=limit
        )

    def search(
        self,
        pattern: str,
        *,
        regex: bool = False,
        ignore_case: bool = False,
        fields: str | Sequence[str] | None = None,
        rollout_ids: object = None,
        evaluation: bool | None = None,
        names: Sequence[str] | None = None,
        limit: int = 100,
        timeout: float = DEFAULT_SEARCH_TIMEOUT,
    ) -> SearchResult:
        """The published samples whose prompt or response (``fields``: ``"prompt"``,
        ``"response"`` or ``"all"``) contains ``pattern``, a literal or, with ``regex``, a
        regular expression bounded by ``timeout`` seconds; at most ``limit`` (up to 10,000)
        matches in archive and position order, each with its keys, reward and the matched
        line.  Reads only the text fields of each record (docs/architecture/search.md, "Search").
        A search that reaches ``timeout`` is no error: it returns what it found, with
        `SearchResult.timed_out` set.

        Raises:
            InvalidInputError: bad pattern (empty, too long, not compiling, matching the
                empty string, repeating too much), field, range or limit.
            SearchTimeoutError: a regular expression ran for more than 2 s on one text
                (backtracking without end).
        """
        from .lens.search import search_pool

        return search_pool(
            self.context,
            pattern,
            regex=regex,
            ignore_case=ignore_case,
            fields=fields,
            rollout_ids=rollout_ids,
            evaluation=evaluation,
            names=names,
            limit=limit,
            timeout=timeout,
        )

    # ------------------------------------------------------------------ owners

    def retain(self, owner: str, name: str) -> bool:
        """Make ``owner`` (e.g. ``checkpoint:step-1200``) retain archive ``name``'s blobs.

        The owner is stored in Unicode NFC, as archive names are (see `archive_manager._util.names`).

        Returns:
            True if the owner was added, False if it already retained the archive.

        Raises:
            InvalidNameError: a malformed owner, or one holding invisible characters.
            ArchiveNotFoundError: no such published archive.
            ArchiveReleasedError: the archive was released and nothing retains it anymore
                (its payload may already be reclaimed).
        """
        owner = check_new_owner(owner)
        check_archive_name(name)
        r = retention_table
        record = None
        # Before the transaction (an object store's look is a request): a decision whose
        # journal record went to a pool moved or unmounted meanwhile would be lost with a
        # lost catalog.
        self._context.check_in_place(f"retaining {name!r}")
        floor = self._context.journal_floor()
        with self.catalog.write("retain") as conn:
            # Inside: a read-only pool is refused by the write gate first; a journal folder
            # that cannot take the record rolls the decision back.
            self.journal.ready()
            row = archive_by_name(conn, name)
            if row is None or row.state == "pending":
                raise not_found(conn, name)
            held = set(conn.execute(select(r.c.owner).where(r.c.archive_id == row.id)).scalars())
            if held.intersection(name_spellings(owner)):
                return False
            if not held:
                raise ArchiveReleasedError(
                    f"archive {name!r} was released and no owner retains it; its payload may "
                    "already be reclaimed, so it cannot be retained again"
                )
            now = self.clock()
            conn.execute(r.insert().values(owner=owner, archive_id=row.id, created_at=now))
            if row.manifest_digest is not None:
                op = retain_op(owner, row.name, row.manifest_digest, at=now)
                record = stage_record(conn, pool_id_of(conn), [op], now, floor=floor)
        # After the commit, before returning: docs/architecture/retention-journal.md, "Retention
        # journal".
        write_committed(self.journal, record)
        return True

    def release_plan(self, *, owner: str | None = None, name: str | None = None) -> ReleasePlan:
        """What releasing would free, changing nothing: give ``owner`` (as `release_owner`)
        or ``name`` (as `Archive.release`, the archive's own owner)."""
        from .pool.retention import plan_release

        if (owner is None) == (name is None):
            raise InvalidInputError("give exactly one of owner or name")
        if owner is not None:
            with self.catalog.read() as conn:
                owner = stored_owner(conn, check_owner(owner))
            return plan_release(self._context, owner=owner)
        archive = self.open_archive(name)  # type: ignore[arg-type]
        return plan_release(self._context, owner=archive_owner(archive.name), archive=archive.name)

    def release_owner(self, owner: str) -> int:
        """Drop every retention of ``owner`` (its exact stored string, or another Unicode
        normal form of it when no owner is stored under the exact one).

        Returns:
            How many archives it retained (0: it held nothing, and nothing changed).
        """
        owner = check_owner(owner)
        r, a = retention_table, archives_table
        record = None
        self._context.check_in_place(f"releasing owner {owner!r}")  # as `retain`
        floor = self._context.journal_floor()
        with self.catalog.write("release_owner") as conn:
            self.journal.ready()
            owner = stored_owner(conn, owner)
            held = [
                (n, d)
                for n, d in conn.execute(
                    select(a.c.name, a.c.manifest_digest)
                    .join(r, r.c.archive_id == a.c.id)
                    .where(r.c.owner == owner)
                    .order_by(a.c.name)
                )
            ]
            count = int(conn.execute(delete(r).where(r.c.owner == owner)).rowcount)
            # NOTE: a call that drops nothing changes nothing, journal included.  On a catalog
            # restored from a backup and not yet rebuilt, that keeps the holds of this owner
            # made after the backup (the rebuild restores them): retention kept, never lost.
            if count:
                now = self.clock()
                op = release_owner_op(owner, [(n, d) for n, d in held if d is not None], at=now)
                record = stage_record(conn, pool_id_of(conn), [op], now, floor=floor)
        # After the commit, before returning: docs/architecture/retention-journal.md, "Retention
        # journal".
        write_committed(self.journal, record)
        return count

    def release(self, names: Sequence[str], *, dry_run: bool = False) -> ForgetPlan:
        """Release several archives (drop each one's own owner) in one transaction: every
        name is checked first, and either all of them are released or, on any error, none.

        Archives released before are left as they are (``plan.already_released``); one
        another owner still retains is released and listed with those owners
        (`ForgetItem.other_owners`): its payload stays until they let go.  ``dry_run``
        returns the plan and changes nothing.

        Returns:
            A `ForgetPlan` of these archives: ``plan.released`` names what this call released.

        Raises:
            ArchiveNotFoundError: a name that is no published or released archive (with the
                closest names as a hint); nothing was released.
        """
        from .pool.retention import plan_release_names

        if isinstance(names, str):
            raise InvalidInputError("names must be a list of archive names, not one str")
        ids: list[int] = []
        with self.catalog.read() as conn:
            for name in names:
                check_archive_name(name)
                row = archive_by_name(conn, name)
                if row is None or row.state not in ("published", "released"):
                    raise not_found(conn, name)
                if row.id not in ids:
                    ids.append(row.id)
        plan = plan_release_names(self._context, ids)
        plan.dry_run = dry_run
        if not dry_run and plan.release:
            self._refuse_if_read_only("release")
            plan.released = release_archives(self._context, ids)
            _log.info("released %d archive(s)", len(plan.released))
        return plan

    def forget(
        self,
        keep_last: int | None = None,
        keep_within: timedelta | float | str | None = None,
        keep_every: int | None = None,
        rollout_ids: range | tuple[int | None, int | None] | int | None = None,
        evaluation: bool | None = None,
        dry_run: bool = False,
    ) -> ForgetPlan:
        """Apply a retention policy, as restic's ``forget`` does to snapshots: among the
        published archives in scope (``rollout_ids``, ``evaluation``), keep the ``keep_last``
        newest, those created within ``keep_within`` (a duration: ``"2d"``, a `timedelta`,
        seconds) of the newest, and every ``keep_every``-th rollout id; release the rest in
        one transaction (see `archive_manager.pool.retention.plan_forget` for the rules).

        An archive another owner still retains is released too, and the plan says so
        (`ForgetItem.other_owners`): its payload stays until that owner lets go.
        ``dry_run`` returns the plan and changes nothing.

        Raises:
            InvalidInputError: no rule given, or a rule or the scope is invalid.
        """
        from .pool.retention import plan_forget

        plan, ids = plan_forget(
            self._context,
            keep_last=keep_last,
            keep_within=keep_within,
            keep_every=keep_every,
            rollout_ids=rollout_ids,
            evaluation=evaluation,
        )
        plan.dry_run = dry_run
        if not dry_run and ids:
            self._refuse_if_read_only("forget")
            plan.released = release_archives(self._context, ids)
            _log.info("forget released %d archive(s)", len(plan.released))
        return plan

    # ------------------------------------------------------------------ maintenance

    def gc(
        self,
        grace: timedelta | float | str = timedelta(hours=1),
        dry_run: bool = False,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> GcReport:
        """Reclaim every blob no owner retains that is older than ``grace``.

        ``dry_run`` returns the plan (blobs and bytes per archive, and what the grace period
        holds back) and deletes nothing.  ``grace`` is a `timedelta`, seconds, or the CLI's
        text (``"1h"``).  ``progress(done, total)`` counts the bytes deleted.

        Raises:
            InvalidInputError: ``grace`` is negative, not a number, or past `timedelta.max`.
            GcAbortedError: a listing or I/O error, or an inconsistent catalog, stopped it
                before it deleted anything; also while the catalog was created over blobs
                it does not index (a lost catalog), or while manifests on disk are missing
                from the catalog (one restored from a backup), until `rebuild_catalog` ran;
                also when the pool's identity at the blob root changed since it was opened.
        """
        from .pool.gc import collect

        seconds = _grace_seconds(grace)
        if not dry_run:
            self._refuse_if_read_only("gc")
        return collect(self._context, grace=seconds, dry_run=dry_run, progress=progress)

    def verify(
        self,
        read_data: bool = False,
        *,
        subset: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> VerifyReport:
        """Check the catalog against the blob files; with ``read_data``, rehash blobs too.

        ``subset`` limits rehashing to ``"n/t"`` (the n-th of t stable parts) or ``"P%"``.
        ``progress(done, total)`` counts the bytes rehashed.  Never changes anything.
        """
        from .pool.verify import verify_pool

        return verify_pool(self._context, read_data=read_data, subset=subset, progress=progress)

    def rebuild_catalog(
        self, *, progress: Callable[[int, int], None] | None = None, resolve: bool = False
    ) -> RebuildReport:
        """Restore what the catalog lacks from the pool itself: archives from their manifest
        blobs, owners, states and release times from the retention journal.

        For a lost catalog (open the pool with ``recover=True``), a catalog restored from a
        backup or a lagging replica (manifests and decisions written since are missing from
        it), or one that survived in part.  Only blob files without a catalog row are looked
        at; when the catalog is behind the journal, the archives it has get the owners and
        states the journal records (a pending archive published since, an owner added or
        dropped since, a release).  Safe while saves and GC run.  An archive whose manifest
        the journal does not cover (a save that stopped between its publication and its
        journal record) comes back published and retained by its own owner.  When several
        manifests name one archive, the one saved last wins (the published one); every
        manifest not restored is in ``report.skipped`` with its reason.

        A complete run writes a journal checkpoint and lets GC work again, unless journal
        files were damaged (``report.journal_damaged``): then GC stays refused until a
        rebuild with ``resolve=True`` accepts the rebuilt owners.  Journal files this
        account may not open (``report.journal_unreadable``, permission denied) are not
        damaged: ``resolve`` never discards them, and GC stays refused until a rebuild
        that can read them applied them.
        ``progress(done, total)`` is called per archive name.
        """
        from .pool.recovery import rebuild_catalog

        self._refuse_if_read_only("rebuild_catalog")
        try:
            report = rebuild_catalog(self._context, progress=progress, resolve=resolve)
        except BaseException:
            if self._made_catalog is not None:
                # A rebuild of a lost catalog that failed (a full disk, `ulimit -f`) left a
                # partial one, which reads as "no pool here, run init" instead of "catalog
                # lost, rebuild it": the pool is left as this open found it, and closed.
                # Nothing published is lost: a save that went through the partial catalog
                # meanwhile has its manifest and journal records, which the next rebuild reads.
                made, self._made_catalog = self._made_catalog, None
                with contextlib.suppress(Exception):
                    self.close()
                remove_sqlite_files(made)
            raise
        self._made_catalog = None
        return report

    def import_pt(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        trust_pickle: bool = False,
        *,
        rollout_id: Any = _FROM_FILE,
        evaluation: bool | None = None,
        task_key_field: str | None = None,
        reward_key: str | None = None,
    ) -> Archive:
        """Import a ``torch.save`` rollout dump (slime's, or an `Archive.export_pt`) as a new
        archive.

        The dump is read with ``weights_only=True``; one that needs full unpickling (which can
        run code) is refused unless ``trust_pickle``.  What the file records is restored, and
        an argument given here wins over it (docs/architecture/getting-data-out.md, "Exports and
        imports"):

        * ``name``: the exported archive's name, else the file's stem;
        * ``rollout_id``: the dump's ``rollout_id`` (None when it is not an int);
        * ``evaluation``: the exported flag, else False;
        * attrs, the samples' classes and sample keys: as exported;
        * task keys: from ``task_key_field`` when given (a field name such as ``index`` or
          ``group_index``, or a dotted path such as ``metadata.prompt_id``), else as
          exported, else each sample's own (`task_key` attribute or key);
        * ``reward_key``: the part of a dict reward that is each sample's reward (as `save`).

        Raises:
            UnsupportedFormatError: not a dump, it needs pickle and was not trusted, or its
                facts are malformed or disagree with its samples.
            InvalidInputError: a sample lacks ``task_key_field``, or an argument is invalid.
            ArchiveExistsError: the name is taken (nothing is written).
        """
        from .interop.ptdump import read_pt_file, task_keys_from_field
        from .pool.listing import check_rollout_id

        self._refuse_if_read_only("import_pt")
        if evaluation is not None and type(evaluation) is not bool:
            raise InvalidInputError("evaluation must be True, False or None (from the file)")
        if rollout_id is not _FROM_FILE:
            rollout_id = check_rollout_id(rollout_id)
        dump = read_pt_file(path, trust_pickle=trust_pickle)
        facts = dump.facts
        if rollout_id is _FROM_FILE:
            rollout_id = dump.rollout_id
            if not (rollout_id is None or isinstance(rollout_id, int)):
                rollout_id = None
        task_keys: list[str | None] | None = None
        if task_key_field is not None:
            task_keys = task_keys_from_field(dump.samples, task_key_field)
        elif facts is not None:
            task_keys = facts.task_keys
        if name is None:
            name = facts.name if facts is not None else Path(path).stem
        if evaluation is None:
            evaluation = facts.evaluation if facts is not None else False
        return self.save(
            name,
            dump.samples,
            rollout_id=rollout_id,  # _FROM_FILE was replaced
            evaluation=evaluation,
            task_keys=task_keys,
            attrs=facts.attrs if facts is not None else None,
            reward_key=reward_key,
        )

    def import_straw(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
        reward_key: str | None = None,
    ) -> Archive:
        """Import a seed (vime/slime straw) archive index as a new archive, verified sample
        by sample against its source (`archive_manager.interop.straw.import_straw_archive`);
        ``reward_key`` as in `save`.

        Raises:
            UnsupportedFormatError: not a seed index (the pool is left as it was).
            IntegrityError: its straw pool is damaged, or the copy did not verify.
            MissingDependencyError: straw-queue is missing (the ``straw`` extra).
            ArchiveExistsError: the name is taken.
        """
        from .interop.straw import import_straw_archive

        self._refuse_if_read_only("import_straw")
        return import_straw_archive(  # type: ignore[no-any-return]
            self._context, path, name, progress=progress, reward_key=reward_key
        )

    # ------------------------------------------------------------------ getting data out

    def arrow_reader(
        self,
        *,
        columns: Sequence[str] | None = None,
        schema: Any = None,
        names: Sequence[str] | None = None,
        **filters: Any,
    ) -> Any:
        """The samples a query selects across archives as a `pyarrow.RecordBatchReader`, a
        chunk at a time (memory stays bounded); filters as `query`, columns as
        `Archive.to_arrow`; ``schema``: None (the first batch's), ``"scan"`` (a first pass
        finds one every batch fits) or a schema (see `archive_manager.interop.export.arrow_reader`)."""
        from .interop.export import arrow_reader

        return arrow_reader(self._context, columns=columns, schema=schema, names=names, **filters)

    def export(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        format: str | None = None,
        overwrite: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Write archive ``name`` as Parquet, JSONL or slime's ``.pt`` (``format``, else the
        suffix of ``path``), through a temp file (see `archive_manager.interop.export`).
        ``progress(done, total)`` counts the stored bytes read.

        Raises:
            OutputWriteError: the file could not be written (a full disk, a read-only
                folder, no permission...); nothing is left at ``path``."""
        from .interop.export import export_archive

        return export_archive(
            self.open_archive(name), path, format=format, overwrite=overwrite, progress=progress
        )

    def export_many(
        self,
        folder: str | os.PathLike[str],
        *,
        format: str,
        rollout_ids: range | tuple[int | None, int | None] | int | None = None,
        evaluation: bool | None = None,
        overwrite: bool = False,
        progress: Callable[[int, int], None] | None = None,
        rollout_id: range | tuple[int | None, int | None] | int | None = None,
    ) -> list[Path]:
        """Export each published archive of ``rollout_ids`` (an int, a ``range`` or an
        inclusive ``(low, high)`` with optional ends, as `find` takes it; ``rollout_id``
        means the same) and evaluation flag to ``folder/<name>.<format>``;
        ``progress(done, total)`` counts the stored bytes read.  Parquet files get one
        schema, so the folder reads as one table (`archive_manager.interop.export.export_many`)."""
        from .interop.export import export_many

        return export_many(
            self._context,
            folder,
            format=format,
            rollout_ids=rollout_filter(rollout_ids, rollout_id),
            evaluation=evaluation,
            overwrite=overwrite,
            progress=progress,
        )

    def import_table(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        rollout_id: int | None = None,
        evaluation: bool | None = None,
        mapping: dict[str, str] | None = None,
        format: str | None = None,
        rollout_id_column: str | None = None,
        reward_key: str | None = None,
    ) -> Archive:
        """Import a Parquet or JSONL file (an export of this library, or another framework's
        rows with ``mapping`` from sample fields to columns) as a new archive.

        A foreign row's missing status or response length stays unknown in the catalog;
        ``rollout_id_column`` takes the rollout id from a column (TRL's ``step``);
        ``reward_key`` as in `save`."""
        from .interop.export import import_table

        self._refuse_if_read_only("import")
        return import_table(
            self._context,
            path,
            name=name,
            rollout_id=rollout_id,
            evaluation=evaluation,
            mapping=mapping,
            format=format,
            rollout_id_column=rollout_id_column,
            reward_key=reward_key,
        )

    def owners(self) -> OwnersReport:
        """The retention audit: per owner its archives, blobs, bytes exclusive and shared;
        stale leases; unowned blobs awaiting GC; released archives whose payload remains."""
        from .pool.retention import audit_owners

        return audit_owners(self._context)
