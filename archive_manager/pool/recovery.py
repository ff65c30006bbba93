"""Catalog recovery (docs/architecture/recovery.md, "Recovery"): restore the archives the catalog
lacks from the manifest blobs under the blob root (`ArchiveManager.rebuild_catalog`).

Manifests are the source of truth for what an archive is; the catalog is an index over them.
The rebuild is *incremental*: it looks only at blob files that have no catalog row (a lost
catalog has none; one restored from a backup lacks what was written after the backup) and
never changes what the catalog already records.  That is what makes it safe beside live
saves and GC: a save inserts a blob's row before it writes the file, so a file without a row
is never one a save in flight is writing, and every step below runs under the catalog's write
lock, which GC's unlinks also take.

Per archive, one transaction: the name is still free, every blob it needs is present (a file,
or a row that is not being deleted), rows are added for the blobs that had none, and the
archive is inserted published and owned by its own owner.  When several manifests name one
archive, the one saved last wins (`Manifest.order`: the published one, see the manifest
module); every other manifest is reported with its reason.  Owners other than the archive's
own (checkpoints, queues) and releases are not in manifests: they must be restored by hand.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection

from .._util.names import MAX_NAME_BYTES, archive_owner
from ..catalog import (
    CURRENT_STATES,
    archive_blobs_table,
    archives_table,
    blobs_table,
    insert_rows,
    pin_write_lock,
    pool_info_table,
    retention_table,
    set_pool_info,
)
from ..catalog.queries import archive_by_name, batches, blob_rows, inserted_id, raise_save_seq
from ..errors import ArchiveError
from .context import PoolContext
from .gc import kind_of, rowless_files
from .identity import UNINDEXED_BLOBS
from .journal import (
    JOURNAL_UNREADABLE,
    JOURNAL_UNRESOLVED,
    ArchiveState,
    Replay,
    audit,
    catalog_records,
    checkpoint,
    replay,
)
from .manifest import Manifest
from .reachability import dead_pending_ids
from .writer import insert_contents

__all__ = ["RebuildReport", "rebuild_catalog"]

_log = logging.getLogger("archive_manager")

_BATCH = 500

Progress = Callable[[int, int], None]


@dataclass
class RebuildReport:
    """What `rebuild_catalog` restored and what it did not, each with its reason."""

    archives: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # restored name -> name it had
    blobs: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    unknown_files: list[str] = field(default_factory=list)
    # The retention journal (docs/architecture/retention-journal.md, "Retention journal"): what it
    # brought to archives the catalog had (name -> what changed), the archives it knows were
    # released and reclaimed (nothing to restore), and the journal files it could not use.
    journal_applied: bool = False
    brought_forward: dict[str, list[str]] = field(default_factory=dict)
    reclaimed: list[str] = field(default_factory=list)
    journal_damaged: dict[str, str] = field(default_factory=dict)
    journal_foreign: list[str] = field(default_factory=list)
    # Journal files this account may not open (permission denied): not damaged, never
    # discarded, and GC refuses until a rebuild that can read them applied them.
    journal_unreadable: dict[str, str] = field(default_factory=dict)
    # Archives the journal knows only in part (a retain or release whose publication record
    # it lacks): their own owner was assumed.
    journal_partial: list[str] = field(default_factory=list)
    unresolved: bool = False
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return dict(self.__dict__)


class _Skip(Exception):
    """This manifest's archive cannot be restored; the message says why."""


def rebuild_catalog(
    pool: PoolContext, *, progress: Progress | None = None, resolve: bool = False
) -> RebuildReport:
    """Index every blob file the catalog lacks, restore every archive the catalog lacks whose
    manifest and blobs are intact, and, when the catalog is behind the retention journal,
    bring its owners and states forward (see the module docstring).

    Safe on a live pool and on a catalog that survived in part or was restored from a backup,
    and a rebuild killed anywhere is finished by the next one (GC refuses until then).
    ``resolve`` accepts the result although journal files were damaged (GC refuses until a
    rebuild ran with it, see `RebuildReport.unresolved`); never for files this account may
    not read (`RebuildReport.journal_unreadable`): GC refuses until a rebuild read them.
    """
    started = time.perf_counter()
    report = RebuildReport()
    now = pool.clock()
    # Listed before the blobs: a decision committed meanwhile is either in this listing or
    # made on a catalog that has every row it needs.
    journal = _read_journal(pool, report)
    rowless = rowless_files(pool, list(pool.store.iter_stat()))
    kinds: dict[str, str] = {}
    for digest in sorted(rowless):
        try:
            kind = kind_of(pool, digest)
        except (OSError, ArchiveError):
            continue  # vanished since the listing (a GC or a rollback took it)
        if kind is None:
            report.unknown_files.append(digest)
        else:
            kinds[digest] = kind
    by_name: dict[str, list[tuple[Manifest, str]]] = defaultdict(list)
    highest_seq = 0
    for digest in sorted(d for d, k in kinds.items() if k == "manifest"):
        try:
            manifest = Manifest.decode(pool.store.get(digest), digest)
        except (ArchiveError, OSError, KeyError, TypeError, ValueError) as exc:
            report.skipped[digest] = f"{type(exc).__name__}: {exc}"
            continue
        # The name the journal knows it by: an archive an earlier rebuild restored under
        # another name (`~restored-`) must not be taken for an older save of its first name.
        known = journal.state.archives.get(digest) if journal is not None else None
        by_name[known.name if known is not None else manifest.name].append((manifest, digest))
        highest_seq = max(highest_seq, manifest.save_seq or 0)
    for done, name in enumerate(sorted(by_name), start=1):
        # The journal's published archive of a name (or one an owner retains) wins over
        # manifests it does not know (a save of that name that never published); then the
        # save order: a save of the name later than the journal's released archive of it
        # superseded that one (docs/architecture/save-protocol.md, "Superseding a name").
        group = sorted(by_name[name], key=lambda md: _rank(journal, md), reverse=True)
        # The first that can be restored (its blobs all there) is the one the name points
        # at; past one the journal has published (or an owner retains), none is tried.
        while group:
            (winner, digest), group = group[0], group[1:]
            if _restore_one(pool, report, name, digest, winner, kinds, rowless, now, journal):
                break
            if _rank(journal, (winner, digest))[0]:
                break
        # The archives the journal knows the name pointed at before come back too, as
        # superseded records, after the archive the name points at, which they link to.
        for manifest, other in group:
            known = journal.state.archives.get(other) if journal is not None else None
            if known is not None and known.state in ("released", "superseded") and not known.owners:
                earlier = dataclasses.replace(
                    known,
                    state="superseded",
                    superseded_by=known.superseded_by or digest,
                    superseded_at=known.superseded_at or now,
                )
                _restore_one(
                    pool, report, name, other, manifest, kinds, rowless, now, journal, earlier
                )
                continue
            report.skipped[other] = (
                f"superseded: archive {name!r} was saved again later (manifest {digest}"
                f"{_seq_text(winner)}; this one{_seq_text(manifest)})"
            )
        if progress is not None:
            progress(done, len(by_name))
    report.blobs += _index_rest(pool, rowless, kinds, now)
    if journal is not None:
        final = _bring_forward(pool, report)
        _note_reclaimed(pool, final, report)
        highest_seq = max(highest_seq, final.highest_seq)
        report.journal_partial = sorted(a.name for a in final.state.archives.values() if a.partial)
    damaged_open = bool(report.journal_damaged) and not resolve
    # NOTE: an unreadable file is no damaged one: --resolve neither accepts its loss nor
    # moves it away (its decision may hold an archive GC would otherwise reclaim).
    report.unresolved = damaged_open or bool(report.journal_unreadable)
    if resolve and (report.journal_damaged or report.journal_foreign):
        # Accepted: kept as evidence under journal/damaged/, out of every later listing.
        pool.journal.quarantine([*report.journal_damaged, *report.journal_foreign])
    # Only now, every archive restored: a rebuild that died half-way leaves GC refusing.
    with pool.catalog.write("rebuild.finish") as conn:
        raise_save_seq(conn, highest_seq)
        conn.execute(delete(pool_info_table).where(pool_info_table.c.key == UNINDEXED_BLOBS))
        for key, names, still in (
            (JOURNAL_UNRESOLVED, report.journal_damaged, damaged_open),
            (JOURNAL_UNREADABLE, report.journal_unreadable, bool(report.journal_unreadable)),
        ):
            if still:
                set_pool_info(conn, key, json.dumps(sorted(names)))
            else:
                conn.execute(delete(pool_info_table).where(pool_info_table.c.key == key))
    if not report.unresolved:
        # The rebuilt state is the pool's from here on: a checkpoint of it supersedes every
        # journal file read (and any damaged one the operator accepted).
        checkpoint(pool.catalog, pool.journal, pool.clock)
    report.archives.sort()
    report.duration = time.perf_counter() - started
    return report


def _restore_one(
    pool: PoolContext,
    report: RebuildReport,
    name: str,
    digest: str,
    manifest: Manifest,
    kinds: dict[str, str],
    rowless: dict[str, int],
    now: float,
    journal: Replay | None,
    decided: ArchiveState | None = None,
) -> bool:
    """`_restore` one manifest (as ``decided``, else as the journal knows it), its outcome
    in ``report``; whether it was restored."""
    try:
        if decided is None and journal is not None:
            decided = journal.state.archives.get(digest)
        superseded = (
            {m: a for m, a in journal.state.archives.items() if a.state == "superseded"}
            if journal is not None
            else {}
        )
        added, restored_as = _restore(
            pool, digest, manifest, kinds, rowless, now, decided, superseded
        )
        report.blobs += added
    except _Skip as exc:
        report.skipped[digest] = str(exc)
        _log.info("rebuild: manifest %s not restored: %s", digest, exc)
        return False
    except sa_exc.IntegrityError as exc:
        report.skipped[digest] = f"archive {name!r} could not be inserted: {exc.orig}"
        _log.info("rebuild: manifest %s not restored: %s", digest, report.skipped[digest])
        return False
    report.archives.append(restored_as)
    _log.info("rebuild: restored archive %r from manifest %s", restored_as, digest)
    if restored_as != name:
        report.renamed[restored_as] = name
    return True


def _rank(journal: Replay | None, entry: tuple[Manifest, str]) -> tuple[bool, Any, str]:
    """Which manifest of a name the name points at after a rebuild: the highest ranks."""
    manifest, digest = entry
    known = journal.state.archives.get(digest) if journal is not None else None
    held = known is not None and (known.state == "published" or bool(known.owners))
    return (held, manifest.order, digest)


def _seq_text(manifest: Manifest) -> str:
    if manifest.save_seq is not None:
        return f", save {manifest.save_seq}"
    return f", created at {manifest.created_at}"


def _restore(
    pool: PoolContext,
    digest: str,
    m: Manifest,
    kinds: dict[str, str],
    rowless: dict[str, int],
    now: float,
    decided: ArchiveState | None = None,
    superseded: Mapping[str, ArchiveState] | None = None,
) -> tuple[int, str]:
    """Insert archive ``m`` if every blob it needs is there; return how many blob rows it
    added and the name it got (its own, unless the catalog has another archive of that
    name).  ``decided``: what the retention journal knows of it (name, state, times and
    owners); without it, the archive comes back published and owned by itself.
    ``superseded``: the manifests the journal knows were superseded (the archive the catalog
    has for this name is one of them: this archive took its name)."""
    needed: dict[str, str] = {d: "chunk" for d, _, _ in m.chunks}
    needed.update({d: "tensor" for d in m.tensors})
    needed[digest] = "manifest"
    chunk_sizes = {d: size for d, _, size in m.chunks}
    store = pool.store
    superseded = superseded or {}
    with pool.catalog.write("rebuild.archive") as conn:
        rows = blob_rows(conn, list(needed))
        if digest in rows:
            raise _Skip("its manifest was indexed meanwhile (by another rebuild, or a save)")
        name = decided.name if decided is not None else m.name
        existing = archive_by_name(conn, name)
        replaced: int | None = None
        if decided is not None and decided.state == "superseded":
            existing = None  # a superseded record takes no name from anyone
        elif (
            existing is not None
            and existing.state in CURRENT_STATES
            and existing.manifest_digest in superseded
        ):
            # A catalog restored from a backup taken before the name was saved again: the
            # journal says the archive it has was superseded, by this one or a later one.
            replaced, existing_manifest = int(existing.id), existing.manifest_digest
            earlier = superseded[existing.manifest_digest]
            conn.execute(
                update(archives_table)
                .where(archives_table.c.id == replaced)
                .values(state="superseded", superseded_at=earlier.superseded_at or now)
            )
            existing = archive_by_name(conn, name)
        if (
            existing is not None
            and decided is not None
            and dead_pending_ids(conn, now, [existing.id])
        ):
            # A save of this name that never published (a backup caught it pending, its
            # process is gone), while the journal has the name published with this manifest:
            # the published archive takes its name back; the dead claim is rolled back, as
            # GC would.
            conn.execute(delete(archives_table).where(archives_table.c.id == existing.id))
            existing = None
        if existing is not None:
            # NOTE: a catalog restored from a backup, then a save of a name that an archive
            # published after the backup also had: both were real.  Keeping only the
            # catalog's would leave the other's blobs unowned for the next GC, so it comes
            # back under a name of its own (reported), and nothing is lost.
            name = _restored_name(m, digest)
            if archive_by_name(conn, name) is not None:
                raise _Skip(
                    f"the catalog already has archives {m.name!r} and {name!r}; what the "
                    "catalog records is kept"
                )
        sizes: dict[str, int] = {}
        new_rows: list[tuple[str, int, str, str, float]] = []
        revive: list[str] = []
        for d, kind in needed.items():
            row = rows.get(d)
            # Under the write lock: GC and rollbacks unlink only while holding it, so a file
            # seen here stays until this transaction ends.
            present = store.has(d)
            if row is None:
                if not present or kinds.get(d, kind) != kind or d not in rowless:
                    raise _Skip(f"its {kind} blob {d} is missing or not a {kind}")
                size = rowless[d]
                new_rows.append((d, size, kind, "live", now))
            else:
                if row.kind != kind:
                    raise _Skip(f"its {kind} blob {d} is recorded as a {row.kind}")
                if not present:
                    raise _Skip(f"its {kind} blob {d} is missing (recorded {row.state})")
                size = int(row.size)
                if row.state in ("deleting", "writing"):
                    # GC unlinks only rows still 'deleting', under this lock: taking the row
                    # back here keeps the file.  A 'writing' row whose file is at its final
                    # name is complete (files are renamed there after their fsync); a save
                    # that never finishes would leave it 'writing' for good.
                    revive.append(d)
            if d in chunk_sizes and chunk_sizes[d] != size:
                raise _Skip(f"its chunk blob {d} holds {size} bytes, not {chunk_sizes[d]}")
            sizes[d] = size
        insert_rows(conn, blobs_table, ("digest", "size", "kind", "state", "created_at"), new_rows)
        if revive:
            conn.execute(
                update(blobs_table)
                .where(
                    blobs_table.c.digest.in_(revive),
                    blobs_table.c.state.in_(("deleting", "writing")),
                )
                .values(state="live", created_at=now)
            )
        created = m.created_at if m.created_at is not None else now
        state, published_at, released_at = "published", created, None
        owners = {archive_owner(name): now}
        superseded_by: int | None = None
        superseded_at: float | None = None
        if decided is not None:
            state = decided.state
            published_at = decided.published_at if decided.published_at is not None else created
            released_at = decided.released_at
            owners = _own_owner_renamed(decided, name)
            if state == "superseded":
                owners = {}
                superseded_at = decided.superseded_at
                superseded_by = _id_of(conn, decided.superseded_by)
        archive_id = inserted_id(
            conn.execute(
                archives_table.insert().values(
                    name=name,
                    rollout_id=m.rollout_id,
                    evaluation=m.evaluation,
                    state=state,
                    manifest_digest=digest,
                    samples=len(m.entries),
                    bytes=sum(sizes.values()),
                    created_at=created,
                    published_at=published_at,
                    released_at=released_at,
                    attrs=m.attrs,
                    reference_name=m.reference,
                    superseded_by=superseded_by,
                    superseded_at=superseded_at,
                    reward_key=m.reward_key,
                )
            )
        )
        if replaced is not None:
            # The archive that took its name: this one, or one restored before it.
            by = superseded[existing_manifest].superseded_by
            conn.execute(
                update(archives_table)
                .where(archives_table.c.id == replaced)
                .values(superseded_by=_id_of(conn, by) if by != digest else archive_id)
            )
        chunks = {i: c for i, c in enumerate(m.chunks)}
        entries = [(pos, *e) for pos, e in enumerate(m.entries)]
        insert_contents(conn, archive_id, chunks, entries, list(m.metadata), m.task_texts)
        insert_rows(
            conn,
            archive_blobs_table,
            ("archive_id", "digest", "kind"),
            [(archive_id, d, k) for d, k in sorted(needed.items())],
        )
        insert_rows(
            conn,
            retention_table,
            ("owner", "archive_id", "created_at"),
            [(o, archive_id, at) for o, at in sorted(owners.items())],
        )
    return len(new_rows), name


def _id_of(conn: Connection, manifest: str | None) -> int | None:
    """The id of the catalog's archive of ``manifest``, if it has one."""
    if manifest is None:
        return None
    found = conn.execute(
        select(archives_table.c.id).where(archives_table.c.manifest_digest == manifest)
    ).scalar()
    return None if found is None else int(found)


def _restored_name(m: Manifest, digest: str) -> str:
    """``<name>~restored-<save number or digest>``, cut to fit the name limit."""
    suffix = f"~restored-{m.save_seq if m.save_seq is not None else digest[:16]}"
    base = m.name
    while len((base + suffix).encode()) > MAX_NAME_BYTES:
        base = base[:-1]
    return base.rstrip() + suffix


def _index_rest(
    pool: PoolContext, rowless: dict[str, int], kinds: dict[str, str], now: float
) -> int:
    """Give every remaining row-less blob file of a known kind a ``live`` row (unowned: GC
    reclaims it after the grace period); return how many rows it added."""
    store = pool.store
    digests = sorted(d for d in rowless if d in kinds)
    added = 0
    for batch in batches(digests, _BATCH):
        with pool.catalog.write("rebuild.blobs") as conn:
            known = set(
                conn.execute(
                    select(blobs_table.c.digest).where(blobs_table.c.digest.in_(batch))
                ).scalars()
            )
            rows = [
                (d, rowless[d], kinds[d], "live", now)
                for d in batch
                if d not in known and store.has(d)
            ]
            insert_rows(conn, blobs_table, ("digest", "size", "kind", "state", "created_at"), rows)
            added += len(rows)
    return added


def _replay(pool: PoolContext, conn: Connection | None = None) -> tuple[Replay, bool]:
    """The retention journal replayed (its files and the records this catalog holds
    itself), and whether the catalog is behind it."""
    found = audit(pool.catalog, pool.journal)
    if conn is None:
        with pool.catalog.read() as reader:
            own = catalog_records(reader)
    else:
        own = catalog_records(conn)
    pool_id = pool.identity.pool_id if pool.identity is not None else None
    replayed = replay(pool.journal, pool_id, found.entries, own)
    return replayed, found.behind


def _read_journal(pool: PoolContext, report: RebuildReport) -> Replay | None:
    """The retention journal replayed, when the catalog is behind it (a lost catalog, one
    restored from a backup or a lagging replica); None when the catalog knows every file."""
    replayed, behind = _replay(pool)
    if not behind:
        return None
    report.journal_applied = True
    report.journal_damaged = dict(replayed.damaged)
    report.journal_foreign = list(replayed.foreign)
    report.journal_unreadable = dict(replayed.unreadable)
    return replayed


def _own_owner_renamed(decided: ArchiveState, name: str) -> dict[str, float]:
    """The journal's owners of an archive, its own owner under the name it has here."""
    owners = dict(decided.owners)
    if decided.name != name:
        at = owners.pop(archive_owner(decided.name), None)
        if at is not None:
            owners[archive_owner(name)] = at
    return owners


def _bring_forward(pool: PoolContext, report: RebuildReport) -> Replay:
    """Give the archives the catalog has the owners, states and times the journal records,
    in one transaction (docs/architecture/recovery.md, "Recovery"); return the replay it used.

    The journal is read again under the write lock: every decision commits under it, and the
    catalog holds the bytes of each record it committed, so a decision made while the rebuild
    ran (its file perhaps not yet written) is part of what is applied, in its place.
    """
    a, r, b = archives_table, retention_table, blobs_table
    with pool.catalog.write("rebuild.journal") as conn:
        pin_write_lock(conn)
        journal, _ = _replay(pool, conn)
        report.journal_damaged = dict(journal.damaged)
        report.journal_foreign = list(journal.foreign)
        report.journal_unreadable = dict(journal.unreadable)
        rows = {
            row.manifest_digest: row
            for row in conn.execute(
                select(a.c.id, a.c.name, a.c.state, a.c.manifest_digest, a.c.published_at).where(
                    a.c.manifest_digest.is_not(None)
                )
            )
        }
        # Superseded first: the archive that took a name may only become current once the
        # one the name pointed at no longer is (one current archive per name).
        for manifest, decided in sorted(
            journal.state.archives.items(),
            key=lambda item: (item[1].state != "superseded", item[0]),
        ):
            row = rows.get(manifest)
            if row is None:
                continue
            if row.state == "superseded":
                continue  # never taken back: the name points at another archive
            held = dict(
                conn.execute(
                    select(r.c.owner, r.c.created_at).where(r.c.archive_id == row.id)
                ).all()
            )
            wanted = _own_owner_renamed(decided, row.name)
            state = decided.state
            changes: list[str] = []
            values: dict[str, Any] = {}
            if row.state == "pending":
                # Published in the journal's history after this catalog's copy was taken
                # (a backup taken mid-save): the save's lease is long gone.
                # Its publication marked live the blobs its ownership claimed 'writing' (the
                # manifest, and the chunks claimed with it): they were durable before it.
                values.update(lease_owner=None, published_at=decided.published_at)
                needed = select(archive_blobs_table.c.digest).where(
                    archive_blobs_table.c.archive_id == row.id
                )
                conn.execute(
                    update(b)
                    .where(b.c.digest.in_(needed), b.c.state == "writing")
                    .values(state="live")
                )
                changes.append(f"{state} (was pending)")
            elif row.state != state:
                changes.append(f"{state} (was {row.state})")
            if row.state != state:
                values.update(state=state, released_at=decided.released_at)
            if state == "superseded":
                values.update(
                    lease_owner=None,
                    superseded_at=decided.superseded_at,
                    superseded_by=_id_of(conn, decided.superseded_by),
                )
            if values:
                conn.execute(update(a).where(a.c.id == row.id).values(**values))
            gone = sorted(set(held) - set(wanted))
            if gone:
                conn.execute(delete(r).where(r.c.archive_id == row.id, r.c.owner.in_(gone)))
                changes += [f"owner {o} dropped" for o in gone]
            added = sorted(set(wanted) - set(held))
            if added:
                insert_rows(
                    conn,
                    r,
                    ("owner", "archive_id", "created_at"),
                    [(o, row.id, wanted[o]) for o in added],
                )
                changes += [f"owner {o} restored" for o in added]
            if changes:
                report.brought_forward[row.name] = changes
    return journal


def _note_reclaimed(pool: PoolContext, journal: Replay, report: RebuildReport) -> None:
    """Report the journal's archives that could not come back: released and reclaimed ones
    (nothing is lost), and owned ones whose manifest is gone (those are)."""
    with pool.catalog.read() as conn:
        have = set(
            conn.execute(
                select(archives_table.c.manifest_digest).where(
                    archives_table.c.manifest_digest.is_not(None)
                )
            ).scalars()
        )
    for manifest, decided in sorted(journal.state.archives.items()):
        if manifest in have or manifest in report.skipped:
            continue
        if decided.state in ("released", "superseded") and not decided.owners:
            report.reclaimed.append(decided.name)
        else:
            owners = ", ".join(sorted(decided.owners)) or "none"
            report.skipped[manifest] = (
                f"archive {decided.name!r} ({decided.state}, owners: {owners}) is in the "
                "retention journal, but its manifest is gone from blobs/: it cannot be restored"
            )
