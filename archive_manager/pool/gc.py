"""Garbage collection (docs/architecture/gc-protocol.md, "GC protocol"): a plan, then its execution.

The plan recomputes reachability in full every run: a blob is kept while an owned archive's
rows name it or a live lease holds it (`reachability.retained`, the one home of that rule).
Deciding is a pure function of catalog rows and file listings (`plan_orphans`, `_retained`);
the shell around it does the I/O in this order:

1. list the blob store's blobs and incomplete writes (any error stops GC before it deletes
   anything, and so does a symlink in place of ``blobs/``, ``tmp/`` or a fan-out folder: the
   filesystem store never lists or unlinks through one; see
   docs/architecture/blob-store-contract.md, "Blob store contract");
2. one transaction: drop expired leases, roll back pending saves whose lease is gone, mark
   ``deleting`` every unretained blob older than the grace period, after checking that no
   owned archive's chunk or manifest is among them (a broken invariant stops GC);
3. per batch, one transaction: unlink the files of rows still ``deleting``, delete the rows.
   Unlinking under the catalog's write lock is what lets a save take a ``deleting`` row back
   safely: it needs the same lock.  A GC killed anywhere leaves rows ``deleting`` that the
   next GC finishes;
4. orphan files (no row), then incomplete writes older than the grace period (at least an
   hour) whose blob no save in flight holds (`reachability.in_flight`): a live save's write is
   never removed, however old its store's clock says it is.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, exists, func, not_, select, update
from sqlalchemy.engine import Connection

from .._util.digest import is_digest
from .._util.failpoints import failpoint
from ..catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    lease_blobs_table,
    leases_table,
    pin_write_lock,
    retention_table,
)
from ..catalog.queries import batches
from ..codec.framing import MAGIC_SIZE, blob_kind
from ..errors import ArchiveError, GcAbortedError, PoolIdentityError
from .context import PoolContext
from .identity import UNINDEXED_BLOBS
from .journal import audit, maintain
from .reachability import dead_pending, in_flight

# The plan's reachability test, by this name: the crash matrix's sabotage test replaces it
# to prove that a GC which counts no owner is caught (tests/crash/test_crash_matrix.py).
from .reachability import retained as _retained

if TYPE_CHECKING:
    from ..blobs import AbstractBlobStore, IncompleteWrite

__all__ = [
    "UNINDEXED_BLOBS",
    "GcPlan",
    "GcReport",
    "apply",
    "collect",
    "kind_of",
    "plan",
    "plan_orphans",
    "roll_back_saves",
    "rowless_files",
    "unindexed_manifests",
]

_BATCH = 500
_log = logging.getLogger("archive_manager")
# An incomplete write that no save in flight holds (`reachability.in_flight`) is removed once
# it is this old, whatever the grace period: one of no save of this library (no digest, or
# another program's) gets this long by the store's clock.
TEMP_MIN_AGE = 3600.0

Progress = Callable[[int, int], None]


@dataclass
class GcReport:
    """What a GC run reclaimed (or, with ``dry_run``, would reclaim)."""

    dry_run: bool
    blobs: int = 0
    bytes: int = 0
    per_archive: dict[str, dict[str, int]] = field(default_factory=dict)
    orphans: int = 0
    orphan_bytes: int = 0
    temp_files: int = 0
    rolled_back: list[str] = field(default_factory=list)
    expired_leases: int = 0
    finished_from_earlier: int = 0
    duration: float = 0.0
    # Unretained blobs the grace period holds back (younger than it): how many, their bytes,
    # and when the first and the last of them become reclaimable (epoch seconds).
    grace_blobs: int = 0
    grace_bytes: int = 0
    grace_first: float | None = None
    grace_last: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "dry_run": self.dry_run,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "per_archive": self.per_archive,
            "orphans": self.orphans,
            "orphan_bytes": self.orphan_bytes,
            "temp_files": self.temp_files,
            "rolled_back": self.rolled_back,
            "expired_leases": self.expired_leases,
            "finished_from_earlier": self.finished_from_earlier,
            "duration": self.duration,
            "grace_blobs": self.grace_blobs,
            "grace_bytes": self.grace_bytes,
            "grace_first": self.grace_first,
            "grace_last": self.grace_last,
        }


def plan_orphans(
    files: Iterable[tuple[str, int, float]], known: set[str], *, cutoff: float
) -> list[tuple[str, int]]:
    """Files under ``blobs/`` with no catalog row, older than ``cutoff``: ``(digest, size)``."""
    return [(d, size) for d, size, mtime in files if d not in known and mtime <= cutoff]


def _dead_pending(conn: Connection, now: float) -> list[tuple[int, str]]:
    a = archives_table
    rows = conn.execute(select(a.c.id, a.c.name).where(dead_pending(now))).all()
    return [(i, n) for i, n in rows]


def _candidates(conn: Connection, now: float, cutoff: float) -> list[tuple[str, int]]:
    b = blobs_table
    return [
        (d, s)
        for d, s in conn.execute(
            select(b.c.digest, b.c.size).where(
                b.c.state.in_(("live", "writing")),
                b.c.created_at <= cutoff,
                not_(_retained(now)),
            )
        )
    ]


def _held_by_grace(
    conn: Connection, now: float, cutoff: float
) -> tuple[int, int, float | None, float | None]:
    """Unretained blobs younger than the grace period: count, bytes, oldest and newest
    creation time (what the next GC after those times reclaims)."""
    b = blobs_table
    count, size, first, last = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(b.c.size), 0),
            func.min(b.c.created_at),
            func.max(b.c.created_at),
        ).where(b.c.state.in_(("live", "writing")), b.c.created_at > cutoff, not_(_retained(now)))
    ).one()
    return int(count), int(size), first, last


def _check_invariant(conn: Connection, digests: Sequence[str]) -> None:
    """Refuse a plan that would delete what an owned archive's own rows name."""
    c, a, r, ab = chunks_table, archives_table, retention_table, archive_blobs_table
    owned = exists().where(r.c.archive_id == a.c.id)
    for batch in batches(digests, _BATCH):
        hit = (
            conn.execute(
                select(a.c.name, c.c.digest)
                .join(c, c.c.archive_id == a.c.id)
                .where(owned, a.c.state != "pending", c.c.digest.in_(batch))
                .limit(1)
            ).first()
            or conn.execute(
                select(a.c.name, a.c.manifest_digest)
                .where(owned, a.c.state != "pending", a.c.manifest_digest.in_(batch))
                .limit(1)
            ).first()
            # Rows left 'deleting' by an earlier GC were never checked against this catalog.
            or conn.execute(
                select(a.c.name, ab.c.digest)
                .join(ab, ab.c.archive_id == a.c.id)
                .where(owned, a.c.state != "pending", ab.c.digest.in_(batch))
                .limit(1)
            ).first()
        )
        if hit is not None:
            raise GcAbortedError(
                f"gc stopped before deleting anything: archive {hit[0]!r}, which is owned, "
                f"needs blob {hit[1]}, which this gc would delete (the catalog is "
                "inconsistent; run verify)"
            )


def _per_archive(
    conn: Connection, digests: Sequence[str], sizes: dict[str, int]
) -> dict[str, dict[str, int]]:
    ab, a = archive_blobs_table, archives_table
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"blobs": 0, "bytes": 0})
    for batch in batches(digests, _BATCH):
        for name, digest in conn.execute(
            select(a.c.name, ab.c.digest)
            .join(a, a.c.id == ab.c.archive_id)
            .where(ab.c.digest.in_(batch))
        ):
            out[name]["blobs"] += 1
            out[name]["bytes"] += sizes.get(digest, 0)
    return dict(out)


@dataclass
class GcPlan:
    """One GC's decisions (docs/architecture/gc-protocol.md, "GC protocol"): taken in the plan
    transaction, which also marks them unless it is a dry run; `apply` then carries them out.
    A dry run is the plan alone."""

    now: float
    grace: float
    expired: list[str] = field(default_factory=list)  # leases to drop
    rolled_back: list[tuple[int, str]] = field(default_factory=list)  # dead pending saves
    condemned: dict[str, int] = field(default_factory=dict)  # digest -> size, marked deleting
    earlier: dict[str, int] = field(default_factory=dict)  # left deleting by an earlier GC
    per_archive: dict[str, dict[str, int]] = field(default_factory=dict)
    orphans: list[tuple[str, int]] = field(default_factory=list)  # files without a row
    stale_temps: list[IncompleteWrite] = field(default_factory=list)
    held: tuple[int, int, float | None, float | None] = (0, 0, None, None)  # by the grace

    def report(self, *, dry_run: bool, duration: float = 0.0) -> GcReport:
        """What this plan reclaims, as a `GcReport`."""
        return GcReport(
            dry_run=dry_run,
            blobs=len(self.condemned) + len(self.earlier),
            bytes=sum(self.condemned.values()) + sum(self.earlier.values()),
            per_archive=self.per_archive,
            orphans=len(self.orphans),
            orphan_bytes=sum(s for _, s in self.orphans),
            temp_files=len(self.stale_temps),
            rolled_back=sorted(n for _, n in self.rolled_back),
            expired_leases=len(self.expired),
            finished_from_earlier=len(self.earlier),
            duration=duration,
            grace_blobs=self.held[0],
            grace_bytes=self.held[1],
            grace_first=None if self.held[2] is None else self.held[2] + self.grace,
            grace_last=None if self.held[3] is None else self.held[3] + self.grace,
        )


def collect(
    pool: PoolContext,
    *,
    grace: float,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> GcReport:
    """Run one GC over ``pool`` (see the module docstring).  ``grace`` is in seconds.

    Raises:
        GcAbortedError: a listing or I/O error, or a broken invariant, stopped GC before it
            deleted anything (or, for an unlink error, left the rest for the next run).
    """
    started = time.perf_counter()
    decided = plan(pool, grace=grace, mark=not dry_run)
    if not dry_run:
        for lease in decided.expired:
            _log.info("gc: lease %s expired; dropped", lease)
        for _, name in decided.rolled_back:
            _log.info("gc: pending save %r lost its lease; rolled back", name)
        apply(pool, decided, progress)
    report = decided.report(dry_run=dry_run, duration=time.perf_counter() - started)
    if not dry_run:
        _log.info(
            "gc: deleted %d blob(s), %d bytes, %d orphan file(s), %d stale temp file(s)",
            report.blobs,
            report.bytes,
            report.orphans,
            report.temp_files,
        )
    return report


def plan(pool: PoolContext, *, grace: float, mark: bool) -> GcPlan:
    """Check that GC may run, list the blob store, and decide in one transaction; with
    ``mark``, that transaction (``gc.plan``) also drops the expired leases, rolls back the
    dead pending saves and marks the condemned blobs ``deleting``, so a GC killed after it is
    finished by the next one.  Without, it only reads (a dry run).

    Raises:
        GcAbortedError: GC may not run, the listing failed, or the invariant is broken.
    """
    store, catalog = pool.store, pool.catalog
    now = pool.clock()
    cutoff = now - grace
    _check_in_place(pool, "before deleting anything")
    if catalog.get_pool_info(UNINDEXED_BLOBS) is not None:
        raise GcAbortedError(
            "gc stopped before deleting anything: this catalog was created over a blob root "
            "that already held blobs (was the catalog lost, emptied or replaced?), so it "
            "would take them all for orphans; run rebuild_catalog ('archive-manager "
            "rebuild-catalog') first"
        )
    try:
        files = list(store.iter_stat())
        temps = store.incomplete_writes()
    # Every store's failure is an OSError (docs/architecture/blob-store-contract.md, "Blob store
    # contract").
    except OSError as exc:
        raise GcAbortedError(
            f"gc stopped before deleting anything: cannot list blobs: {exc}"
        ) from exc
    _refuse_if_behind(pool, files)
    _refuse_if_behind_journal(pool)

    decided = GcPlan(now=now, grace=grace)
    with catalog.write("gc.plan") if mark else catalog.read() as conn:
        lt = leases_table
        decided.expired = list(
            conn.execute(select(lt.c.owner).where(lt.c.expires_at <= now)).scalars()
        )
        decided.rolled_back = _dead_pending(conn, now)
        decided.condemned = dict(_candidates(conn, now, cutoff))
        digests = list(decided.condemned)
        decided.earlier = {
            d: s
            for d, s in conn.execute(
                select(blobs_table.c.digest, blobs_table.c.size).where(
                    blobs_table.c.state == "deleting"
                )
            )
        }
        _check_invariant(conn, digests + list(decided.earlier))
        decided.per_archive = _per_archive(conn, digests, decided.condemned)
        decided.held = _held_by_grace(conn, now, cutoff)
        if mark:
            _mark(conn, decided)
        known_rows = set(conn.execute(select(blobs_table.c.digest)).scalars())
        old = [t for t in temps if t.mtime <= now - max(grace, TEMP_MIN_AGE)]
        busy = in_flight(conn, now, [t.digest for t in old if t.digest is not None])
    decided.orphans = plan_orphans(files, known_rows, cutoff=cutoff)
    decided.stale_temps = [t for t in old if t.digest is None or t.digest not in busy]
    return decided


def _check_in_place(pool: PoolContext, when: str) -> None:
    """GcAbortedError unless the root still holds the pool opened (`check_identity`).

    NOTE: at the plan and again before each batch of unlinks, outside the catalog's
    transaction: a root that moved, went away with its mount or now holds another pool (a
    mount swapped under a long GC) may hold files of the same digests, which are not this
    catalog's to delete.
    """
    try:
        pool.check_in_place("gc")
    except (PoolIdentityError, OSError) as exc:
        raise GcAbortedError(f"gc stopped {when}: {exc}") from exc


def _mark(conn: Connection, decided: GcPlan) -> None:
    """The plan transaction's writes: what a GC killed after it leaves for the next."""
    roll_back_saves(conn, decided.expired, [archive_id for archive_id, _ in decided.rolled_back])
    for batch in batches(list(decided.condemned), _BATCH):
        conn.execute(
            update(blobs_table).where(blobs_table.c.digest.in_(batch)).values(state="deleting")
        )


def roll_back_saves(conn: Connection, leases: Sequence[str], archive_ids: Sequence[int]) -> None:
    """Inside a write transaction: drop ``leases`` with the holds they have, and delete the
    pending archives ``archive_ids`` (their rows and own owner go with them).  What GC's plan
    does for expired leases and dead pending saves, and a new save for a crashed save of its
    name (`writer.free_name`).  Blobs are left to the reachability rule: what no live lease
    or retaining archive needs, GC reclaims after the grace period."""
    lt = leases_table
    for batch in batches(list(leases), _BATCH):
        conn.execute(delete(lease_blobs_table).where(lease_blobs_table.c.lease.in_(batch)))
        conn.execute(delete(lt).where(lt.c.owner.in_(batch)))
    for batch_ids in batches(list(archive_ids), _BATCH):
        conn.execute(
            delete(archives_table).where(
                archives_table.c.id.in_(batch_ids), archives_table.c.state == "pending"
            )
        )


def apply(pool: PoolContext, decided: GcPlan, progress: Progress | None = None) -> None:
    """Carry out a marked plan: unlink every ``deleting`` blob (this plan's and any an
    earlier GC left), then the orphan files and the incomplete writes of dead writers, then
    tidy the journal.

    Raises:
        GcAbortedError: an unlink failed (the rest is left for the next run), or the
            journal's checkpoint could not be written (everything else is done).
    """
    _execute(pool, progress)
    _remove_orphans(pool, [d for d, _ in decided.orphans])
    if decided.stale_temps:
        _check_in_place(pool, "before removing stale temp files")
    for write in decided.stale_temps:
        _remove_incomplete(pool.store, write)
    try:
        maintain(pool.catalog, pool.journal, pool.clock)
    except OSError as exc:
        # Everything GC had to do is done; the journal is tidied by the next run.
        raise GcAbortedError(f"gc could not write the journal's checkpoint: {exc}") from exc


def kind_of(pool: PoolContext, digest: str) -> str | None:
    """The kind of blob file ``digest`` by its magic (None: not a blob of this library).

    Raises:
        OSError, ArchiveError: the file vanished or cannot be read as a blob.
    """
    return blob_kind(pool.store.read_head(digest, MAGIC_SIZE))


def rowless_files(pool: PoolContext, files: list[tuple[str, int, float]]) -> dict[str, int]:
    """Of the listed blob files, those with no catalog row, and their sizes."""
    if not files:
        return {}
    # One scan of the digests: GC reads them all anyway, and 200 IN-lists of 500 for a pool
    # of 100,000 blobs cost more than the scan.
    with pool.catalog.read() as conn:
        known = set(conn.execute(select(blobs_table.c.digest)).scalars())
    return {d: size for d, size, _ in files if d not in known}


def unindexed_manifests(pool: PoolContext, rowless: dict[str, int]) -> list[str]:
    """Of the row-less blob files, the manifests: archives the catalog lacks."""
    found = []
    for digest in sorted(rowless):
        try:
            if kind_of(pool, digest) == "manifest":
                found.append(digest)
        except (OSError, ArchiveError):
            continue  # vanished or unreadable: nothing anyone can restore from
    return found


def _refuse_if_behind(pool: PoolContext, files: list[tuple[str, int, float]]) -> None:
    """Stop if a manifest on disk has no catalog row: the catalog is behind its blobs.

    NOTE: a save inserts a blob's row before it writes the file, so in a catalog that is not
    behind, no manifest file is ever without a row.  One that is (restored from a backup, a
    failover to a lagging replica) lacks the archives saved since, and would take their
    blobs, manifests included, for orphans: after that no rebuild could bring them back.
    Only row-less files are read (their first bytes), which a healthy pool has few of.
    """
    behind = unindexed_manifests(pool, rowless_files(pool, files))
    if behind:
        raise GcAbortedError(
            f"gc stopped before deleting anything: {len(behind)} archive manifest(s) under "
            f"blobs/ are missing from the catalog (first: {behind[0]}): the catalog is behind "
            "its blobs (restored from a backup, or a lagging replica?); run rebuild_catalog "
            "('archive-manager rebuild-catalog'), which restores only what the catalog lacks"
        )


def _refuse_if_behind_journal(pool: PoolContext) -> None:
    """Stop if the retention journal holds decisions the catalog lacks, or a rebuild left
    damaged journal files for an operator to decide on (docs/architecture/retention-journal.md,
    "Retention journal").

    NOTE: a catalog behind the journal (restored from a backup, a lagging replica) may lack
    the publication of an archive it still holds as pending, the release of an archive or an
    owner's hold: GC would roll back the first and, once its other owners let go, reclaim
    what the missing hold protects.
    """
    try:
        found = audit(pool.catalog, pool.journal)
    except OSError as exc:
        raise GcAbortedError(
            f"gc stopped before deleting anything: cannot list the journal: {exc}"
        ) from exc
    if found.position.unresolved:
        raise GcAbortedError(
            "gc stopped before deleting anything: the last rebuild could not read "
            f"{len(found.position.unresolved)} journal file(s) (first: "
            f"{found.position.unresolved[0]}), so owners may be missing; check the pool, then "
            "accept the rebuilt owners with 'archive-manager rebuild-catalog --resolve'"
        )
    if found.position.unreadable:
        raise GcAbortedError(
            "gc stopped before deleting anything: the last rebuild could not open "
            f"{len(found.position.unreadable)} journal file(s) (first: "
            f"{found.position.unreadable[0]}: permission denied), so owners they hold may be "
            "missing; have their owner or root make them readable ('archive-manager init "
            "--shared-group GROUP' for a group-shared pool, or chmod a+r), then run "
            "'archive-manager rebuild-catalog' again"
        )
    if found.behind:
        raise GcAbortedError(
            f"gc stopped before deleting anything: {len(found.unknown)} retention journal "
            f"file(s) under journal/ are unknown to the catalog (first: {found.unknown[0].name}): "
            "the catalog is behind the pool (restored from a backup, or a lagging replica?); "
            "run rebuild_catalog ('archive-manager rebuild-catalog'), which brings it forward"
        )


def _execute(pool: PoolContext, progress: Progress | None) -> None:
    """Unlink and forget every ``deleting`` blob, a batch per transaction."""
    b = blobs_table
    with pool.catalog.read() as conn:
        sizes = dict(
            conn.execute(select(b.c.digest, b.c.size).where(b.c.state == "deleting")).all()
        )
    todo = list(sizes)
    # Progress counts bytes (the unit a person can set against the pool's size), not blobs.
    total = sum(sizes.values())
    done = 0
    for batch in batches(todo, _BATCH):
        _check_in_place(pool, "before deleting more")
        with pool.catalog.write("gc.delete") as conn:
            still = (
                conn.execute(
                    select(b.c.digest).where(b.c.digest.in_(batch), b.c.state == "deleting")
                )
                .scalars()
                .all()
            )
            if still:
                pin_write_lock(conn)
            try:
                # One call per batch: an object store deletes up to 1,000 keys a request.
                _unlink_many(pool, still)
            except OSError as exc:
                # The transaction rolls back: the rows stay 'deleting' for the next GC, which
                # deletes again whatever of them is still there.
                raise GcAbortedError(f"gc could not unlink blobs of this batch: {exc}") from exc
            for _ in still:
                failpoint("gc.after_unlink")
            conn.execute(delete(b).where(b.c.digest.in_(still), b.c.state == "deleting"))
        done += sum(sizes[d] for d in batch)
        if progress is not None:
            progress(done, total)


def _remove_orphans(pool: PoolContext, digests: list[str]) -> None:
    b = blobs_table
    for part in batches(digests, _BATCH):
        batch = [d for d in part if is_digest(d)]
        _check_in_place(pool, "before deleting more")
        with pool.catalog.write() as conn:
            # Re-checked under the write lock: a save that inserted a row since the listing
            # owns the file now.
            known = set(conn.execute(select(b.c.digest).where(b.c.digest.in_(batch))).scalars())
            if len(known) < len(batch):
                pin_write_lock(conn)
            orphans = [d for d in batch if d not in known]
            try:
                _unlink_many(pool, orphans)
            except OSError as exc:
                raise GcAbortedError(f"gc could not unlink orphans of this batch: {exc}") from exc
            for _ in orphans:
                failpoint("gc.orphan.after_unlink")


def _unlink_many(pool: PoolContext, digests: Sequence[str]) -> None:
    """Unlink ``digests``' files; one already gone is what GC wanted (a store's delete may
    say so with FileNotFoundError rather than False, then the rest are retried one by one)."""
    if not digests:
        return
    try:
        pool.store.delete_many(digests)
    except FileNotFoundError:
        for digest in digests:
            with contextlib.suppress(FileNotFoundError):
                pool.store.delete(digest)


def _remove_incomplete(store: AbstractBlobStore, write: IncompleteWrite) -> None:
    # A writer may have finished (renamed) it meanwhile, or it is already gone; a tmp/ that
    # became a symlink since it was listed (PoolLayoutError, an OSError) is not swept.
    with contextlib.suppress(OSError):
        store.remove_incomplete(write)
