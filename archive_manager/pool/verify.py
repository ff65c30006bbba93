"""Consistency and integrity checks (`ArchiveManager.verify`).  They only read: they never
change the pool.

Everything is computed from a handful of whole-table reads and one listing of ``blobs/``, so
the cost grows linearly with the pool, not with archives times blobs.
"""

from __future__ import annotations

import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import func, select

from .._util.holders import describe_holder, holder_status
from .._util.permissions import shared_problems
from ..catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    chunks_table,
    entries_table,
    leases_table,
    retention_table,
)
from ..catalog.engine import shown_url, sqlite_path
from ..catalog.queries import batches
from ..errors import BlobNotFoundError, IntegrityError, InvalidInputError, JournalDamagedError
from .context import PoolContext
from .gc import unindexed_manifests
from .journal import audit, unreadable_reason
from .reachability import dead_pending_ids, retained_digests

__all__ = [
    "Finding",
    "FindingKind",
    "VerifyReport",
    "parse_subset",
    "verify_pool",
]

Progress = Callable[[int, int], None]


FindingKind = Literal[
    # problems: damage, which makes `VerifyReport.ok` False
    "archive-blob",  # an owned archive needs a blob without a row, not live, or not on disk
    "broken-rows",  # an archive's own rows disagree (chunk ordinals, entries, its manifest)
    "corrupt-blob",  # a blob's bytes do not hash to its digest, or its path holds no file
    "journal-behind",  # journal files hold decisions the catalog lacks
    "journal-damaged",  # a journal file still in use does not read back
    "journal-unresolved",  # the last rebuild left damaged journal files to decide on
    "journal-unreadable",  # a journal file this account may not open (permissions)
    "missing-blob",  # a live blob's file is gone
    "unindexed-manifest",  # a manifest on disk has no row: the catalog is behind its blobs
    "wrong-size",  # a live blob's file has another size than its row
    # notices: what crashes and pending GC leave behind, and what locks a member out
    "deleting-blob",
    "journal-checkpoint",
    "journal-gap",
    "journal-stray",
    "orphan-file",
    "pending-save",
    "permissions",
    "stale-lease",
    "unowned-blobs",
    "unwritten-blob",
]
"""The kinds of `Finding`: stable strings that callers and tests match on."""


@dataclass(frozen=True)
class Finding:
    """One problem or notice: what kind, what it concerns, and a sentence for people."""

    kind: FindingKind
    message: str
    digest: str | None = None
    archive: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "kind": self.kind,
            "message": self.message,
            "digest": self.digest,
            "archive": self.archive,
        }


@dataclass
class VerifyReport:
    """`problems` are damage (``ok`` is False when there is any); `notices` are what crashes
    and pending GC leave behind, which GC clears."""

    problems: list[Finding] = field(default_factory=list)
    notices: list[Finding] = field(default_factory=list)
    blobs_checked: int = 0
    bytes_read: int = 0
    read_data: bool = False
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no damage was found."""
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "ok": self.ok,
            "problems": [f.as_dict() for f in self.problems],
            "notices": [f.as_dict() for f in self.notices],
            "blobs_checked": self.blobs_checked,
            "bytes_read": self.bytes_read,
            "read_data": self.read_data,
            "duration": self.duration,
        }


_SUBSET_PART = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_SUBSET_PCT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_subset(subset: str | None) -> Callable[[str], bool]:
    """A predicate choosing which blobs ``read_data`` rehashes.

    ``None`` means all; ``"n/t"`` the n-th of t parts by digest (1-based, stable across runs,
    so t runs cover every blob once, as restic's ``--read-data-subset``); ``"P%"`` a random
    P percent.

    Raises:
        InvalidInputError: the subset is malformed.
    """
    if subset is None:
        return lambda _d: True
    if m := _SUBSET_PART.match(subset):
        n, t = int(m.group(1)), int(m.group(2))
        if not 1 <= n <= t:
            raise InvalidInputError(f"subset {subset!r}: n/t needs 1 <= n <= t")
        return lambda d: int(d[:8], 16) % t == n - 1
    if m := _SUBSET_PCT.match(subset):
        pct = float(m.group(1))
        if not 0 < pct <= 100:
            raise InvalidInputError(f"subset {subset!r}: the percentage must be in (0, 100]")
        rng = random.Random()
        return lambda _d: rng.random() * 100 < pct
    raise InvalidInputError(f"subset {subset!r} must read 'n/t' (e.g. 1/10) or 'P%' (e.g. 10%)")


def verify_pool(
    pool: PoolContext,
    *,
    read_data: bool = False,
    subset: str | None = None,
    progress: Progress | None = None,
) -> VerifyReport:
    """Check the pool's catalog against its blob files (see `VerifyReport`).

    In phases, each adding its findings in turn: a snapshot (the blob listing, then the
    catalog's rows in one read transaction), the blobs, the archives, the leases, the blobs'
    bytes (with ``read_data``), the retention journal, and the shared pool's permissions.
    """
    started = time.perf_counter()
    chosen = parse_subset(subset)
    report = VerifyReport(read_data=read_data)
    snap = _snapshot(pool)
    _check_blobs(pool, snap, report)
    _check_archives(snap, report)
    _check_leases(snap, report)
    if read_data:
        _read_data(pool, snap, report, chosen, progress)
    else:
        report.blobs_checked = len(snap.blobs)
    _check_journal(pool, report, read_data=read_data)
    _check_permissions(pool, report)
    report.duration = time.perf_counter() - started
    return report


@dataclass
class _Snapshot:
    """What verify compares: the blob listing and the catalog's rows, read once."""

    now: float
    files: dict[str, int]  # digest -> size on disk (the listing, completed by rechecks)
    blobs: dict[str, Any]  # digest -> blobs row
    archives: dict[int, Any]  # id -> archives row
    needs: dict[int, set[str]]  # archive id -> the blobs it needs
    chunks: dict[int, list[tuple[int, str]]]  # archive id -> (ordinal, digest)
    owned: set[int]  # archives with an owner
    entry_counts: dict[int, int]
    leases: dict[str, float]  # lease -> expiry
    holders: dict[str, Any]  # lease -> its holder (`_util.holders`), None if not recorded
    retained: set[str]  # as GC counts it
    dead: set[int]  # dead pending saves
    users: dict[str, list[str]] = field(default_factory=dict)  # digest -> archive names
    # Filled by the blobs phase: rows that changed since the snapshot, paths holding no file.
    moved: set[str] = field(default_factory=set)
    not_files: dict[str, str] = field(default_factory=dict)

    def damaged(self, kind: FindingKind, digest: str, message: str) -> Finding:
        """A finding about a damaged blob, naming the archives that need it."""
        names = self.users.get(digest, [])
        if names:
            shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
            message += f" (needed by archive {shown})"
        return Finding(kind, message, digest, names[0] if names else None)


def _snapshot(pool: PoolContext) -> _Snapshot:
    """List the blob store, then read the catalog's rows in one transaction."""
    now = pool.clock()
    files = {d: size for d, size, _mtime in pool.store.iter_stat()}
    b, a, ab, c, r, e = (
        blobs_table,
        archives_table,
        archive_blobs_table,
        chunks_table,
        retention_table,
        entries_table,
    )
    with pool.catalog.read() as conn:
        blobs = {
            row.digest: row
            for row in conn.execute(select(b.c.digest, b.c.size, b.c.state, b.c.created_at))
        }
        archives = {
            row.id: row
            for row in conn.execute(
                select(
                    a.c.id, a.c.name, a.c.state, a.c.samples, a.c.manifest_digest, a.c.lease_owner
                )
            )
        }
        needs: dict[int, set[str]] = defaultdict(set)
        for archive_id, digest in conn.execute(select(ab.c.archive_id, ab.c.digest)):
            needs[archive_id].add(digest)
        chunks: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for archive_id, ordinal, digest in conn.execute(
            select(c.c.archive_id, c.c.ordinal, c.c.digest)
        ):
            chunks[archive_id].append((ordinal, digest))
        owned = set(conn.execute(select(r.c.archive_id).distinct()).scalars())
        entry_counts: dict[int, int] = dict(
            conn.execute(select(e.c.archive_id, func.count()).group_by(e.c.archive_id)).all()
        )
        lease_rows = conn.execute(
            select(leases_table.c.owner, leases_table.c.expires_at, leases_table.c.holder)
        ).all()
        leases = {row.owner: row.expires_at for row in lease_rows}
        holders = {row.owner: row.holder for row in lease_rows}
        # As GC counts it (docs/architecture/gc-protocol.md, "GC protocol"): one rule, in
        # reachability.
        retained = retained_digests(conn, now)
        dead = dead_pending_ids(conn, now)

    # Damage to a blob is reported with the archives that need it (owned ones first): the
    # question after "what is broken" is always "which archives can no longer be read".
    users: dict[str, list[str]] = defaultdict(list)
    for archive_id in sorted(needs, key=lambda i: (i not in owned, archives[i].name)):
        for digest in needs[archive_id]:
            users[digest].append(archives[archive_id].name)

    return _Snapshot(
        now=now,
        files=files,
        blobs=blobs,
        archives=archives,
        needs=needs,
        chunks=chunks,
        owned=owned,
        entry_counts=entry_counts,
        leases=leases,
        holders=holders,
        retained=retained,
        dead=dead,
        users=users,
    )


def _check_blobs(pool: PoolContext, snap: _Snapshot, report: VerifyReport) -> None:
    """Each blob row against the listing; files without a row."""
    blobs, files, damaged = snap.blobs, snap.files, snap.damaged
    # NOTE: the listing comes before the snapshot, so a save may have written a blob since
    # (and marked it live), and GC may have unlinked one after (marking it deleting first).
    # A recorded blob the listing missed is only missing if its file is still absent and its
    # row is still the very row of the snapshot (GC and saves give a row a new created_at or
    # a new state whenever its file may legitimately come or go).
    # A FIFO, symlink or folder at a blob's path is not listed; the recheck finds it.
    not_files = snap.not_files
    moved = snap.moved = _recheck_unlisted(
        pool, {d: row for d, row in blobs.items() if row.state != "deleting"}, files, not_files
    )

    problem, notice = report.problems.append, report.notices.append
    for digest, row in blobs.items():
        on_disk = files.get(digest)
        if digest in moved:
            continue
        if digest in not_files:
            problem(damaged("corrupt-blob", digest, not_files[digest]))
        elif row.state == "live":
            if on_disk is None:
                problem(
                    damaged(
                        "missing-blob",
                        digest,
                        f"blob {digest} is recorded live but its file is missing",
                    )
                )
            elif on_disk != row.size:
                problem(
                    damaged(
                        "wrong-size",
                        digest,
                        f"blob {digest} is {on_disk} bytes on disk, {row.size} in the catalog",
                    )
                )
        elif row.state == "writing" and on_disk is None:
            notice(
                Finding(
                    "unwritten-blob",
                    f"blob {digest} was being written by a save that did not finish",
                    digest,
                )
            )
        elif row.state == "deleting":
            notice(
                Finding(
                    "deleting-blob",
                    f"blob {digest} is marked deleting by a GC that has not finished",
                    digest,
                )
            )
    rowless = {d: size for d, size in files.items() if d not in blobs}
    behind = set(unindexed_manifests(pool, rowless))
    for digest, size in rowless.items():
        if digest in behind:
            # A catalog behind its blobs (restored from a backup): an archive it lacks.
            problem(
                Finding(
                    "unindexed-manifest",
                    f"manifest blob {digest} has no catalog row: the catalog lacks its archive "
                    "(restored from a backup?); run rebuild-catalog (gc refuses until then)",
                    digest,
                )
            )
            continue
        notice(
            Finding(
                "orphan-file",
                f"file of blob {digest} ({size} bytes) has no catalog row; gc removes it",
                digest,
            )
        )


def _check_archives(snap: _Snapshot, report: VerifyReport) -> None:
    """Each archive: pending saves, and an owned archive's blobs and rows."""
    blobs, files, moved, not_files = snap.blobs, snap.files, snap.moved, snap.not_files
    problem, notice = report.problems.append, report.notices.append
    archives, owned, needs = snap.archives, snap.owned, snap.needs
    chunks, entry_counts = snap.chunks, snap.entry_counts
    for archive_id, row in archives.items():
        name = row.name
        if row.state == "pending":
            notice(Finding("pending-save", _pending_text(snap, archive_id, row), archive=name))
        if archive_id not in owned:
            continue
        digests = needs.get(archive_id, set())
        for digest in sorted(digests):
            blob = blobs.get(digest)
            if blob is None or (
                blob.state != "live" and not (row.state == "pending" and blob.state == "writing")
            ):
                state = "has no catalog row" if blob is None else f"is {blob.state}"
                problem(
                    Finding(
                        "archive-blob",
                        f"archive {name!r} needs blob {digest}, which {state}",
                        digest,
                        name,
                    )
                )
            elif blob.state == "writing":
                # A pending save's blob not yet written (its manifest and last chunks are
                # written after the ownership commit): the save is in flight, or dead and GC
                # rolls it back; the blob's own notice says so.  Only a live blob's absence is
                # damage.
                continue
            elif digest not in files and digest not in moved:
                what = "path holds no regular file" if digest in not_files else "file is missing"
                problem(
                    Finding(
                        "archive-blob",
                        f"archive {name!r} needs blob {digest}, whose {what}",
                        digest,
                        name,
                    )
                )
        ordinals = sorted(chunks.get(archive_id, []))
        if [o for o, _ in ordinals] != list(range(len(ordinals))):
            problem(
                Finding(
                    "broken-rows",
                    f"archive {name!r} has chunk ordinals {[o for o, _ in ordinals][:10]}, not 0..n-1",
                    archive=name,
                )
            )
        for ordinal, digest in ordinals:
            if digest not in digests:
                problem(
                    Finding(
                        "broken-rows",
                        f"archive {name!r} chunk {ordinal} (blob {digest}) is not among the blobs it retains",
                        digest,
                        name,
                    )
                )
        if row.manifest_digest and row.manifest_digest not in digests:
            problem(
                Finding(
                    "broken-rows",
                    f"archive {name!r} does not retain its manifest {row.manifest_digest}",
                    row.manifest_digest,
                    name,
                )
            )
        if entry_counts.get(archive_id, 0) != row.samples:
            problem(
                Finding(
                    "broken-rows",
                    f"archive {name!r} has {entry_counts.get(archive_id, 0)} entries for {row.samples} samples",
                    archive=name,
                )
            )


def _pending_text(snap: _Snapshot, archive_id: int, row: Any) -> str:
    """A pending save, its lease's holder and whether that process is alive (docs/
    architecture/save-protocol.md, "Save protocol", Resuming a killed save)."""
    text = f"archive {row.name!r} is pending"
    if archive_id in snap.dead:
        return text + " and its lease expired; gc rolls it back"
    lease = row.lease_owner
    status = holder_status(snap.holders.get(lease))
    lapses = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(snap.leases[lease]))
    text += (
        f": a save in flight or crashed ({lease}, held by "
        f"{describe_holder(snap.holders.get(lease))}, {status}, lapses at {lapses})"
    )
    if status == "dead":
        text += f"; the next save of {row.name!r} rolls it back, or gc once the lease lapsed"
    return text


def _check_leases(snap: _Snapshot, report: VerifyReport) -> None:
    """Expired leases, and live blobs nothing retains (both for GC to clear)."""
    blobs, now, notice = snap.blobs, snap.now, report.notices.append
    for owner, expires in snap.leases.items():
        if expires <= now:
            notice(
                Finding("stale-lease", f"{owner} expired {now - expires:.0f} s ago; gc drops it")
            )
    unowned = [d for d, row in blobs.items() if row.state == "live" and d not in snap.retained]
    if unowned:
        notice(
            Finding(
                "unowned-blobs",
                f"{len(unowned)} blobs ({sum(blobs[d].size for d in unowned)} bytes) are retained by no owner; gc reclaims them after the grace period",
            )
        )


def _read_data(
    pool: PoolContext,
    snap: _Snapshot,
    report: VerifyReport,
    chosen: Callable[[str], bool],
    progress: Progress | None,
) -> None:
    """Rehash the chosen live blobs; a blob gone meanwhile is judged by its row again."""
    blobs, files, damaged, problem = snap.blobs, snap.files, snap.damaged, report.problems.append
    todo = sorted(d for d, row in blobs.items() if row.state == "live" and d in files and chosen(d))
    vanished = []
    # Progress counts bytes rehashed: the work of a read-data pass is reading them.
    total = sum(blobs[d].size for d in todo)
    for digest in todo:
        try:
            pool.store.check(digest)
        except BlobNotFoundError:
            vanished.append(digest)  # maybe GC's doing: judged below
        except IntegrityError as exc:
            problem(damaged("corrupt-blob", digest, str(exc)))
        report.bytes_read += blobs[digest].size
        if progress is not None:
            progress(report.bytes_read, total)
    found: dict[str, int] = {}
    replaced: dict[str, str] = {}
    moved = _recheck_unlisted(pool, {d: blobs[d] for d in vanished}, found, replaced)
    for digest in vanished:
        if digest in replaced:
            problem(damaged("corrupt-blob", digest, replaced[digest]))
        elif digest not in moved and digest not in found:
            problem(damaged("missing-blob", digest, f"blob {digest} vanished while being verified"))
    report.blobs_checked = len(todo)


def _check_permissions(pool: PoolContext, report: VerifyReport) -> None:
    """Folders and a catalog file of a group-shared pool that would lock a member out."""
    # A notice, not damage: nothing is lost, but another member of a group-shared pool is
    # locked out until the bits are fixed (docs/architecture/shared-pools.md, "Shared pools").
    catalog_file = sqlite_path(pool.catalog_url)
    own_catalog = catalog_file is not None and catalog_file.absolute().parent == pool.root
    for message in shared_problems(
        pool.root,
        catalog_file=catalog_file,
        catalog_url=None if own_catalog else shown_url(pool.catalog_url),
    ):
        report.notices.append(Finding("permissions", message))


def _check_journal(pool: PoolContext, report: VerifyReport, *, read_data: bool) -> None:
    """The retention journal against the catalog (docs/architecture/retention-journal.md, "Retention
    journal"); with ``read_data``, every journal file still in use is read and checked."""
    problem, notice = report.problems.append, report.notices.append
    found = audit(pool.catalog, pool.journal)
    if found.unknown:
        problem(
            Finding(
                "journal-behind",
                f"{len(found.unknown)} retention journal file(s) hold decisions the catalog "
                f"lacks (first: {found.unknown[0].name}): the catalog is behind the pool "
                "(restored from a backup?); run rebuild-catalog (gc refuses until then)",
            )
        )
    for name in found.position.unresolved:
        problem(
            Finding(
                "journal-unresolved",
                f"journal file {name} could not be read by the last rebuild, so owners may be "
                "missing; gc refuses until 'archive-manager rebuild-catalog --resolve'",
            )
        )
    for name in found.position.unreadable:
        problem(
            Finding(
                "journal-unreadable",
                f"journal file {name} could not be opened by the last rebuild (permission "
                "denied), so owners may be missing; make it readable, then run "
                "rebuild-catalog again (gc refuses until then)",
            )
        )
    if found.gaps:
        notice(
            Finding(
                "journal-gap",
                f"{len(found.gaps)} committed decision(s) have no journal record yet (a "
                "process stopped between its commit and its record, or is writing it now); "
                "the catalog holds them, and the next gc writes their files",
            )
        )
    if found.missing_checkpoint:
        notice(
            Finding(
                "journal-checkpoint",
                "the catalog's journal checkpoint file is missing; the next gc writes one",
            )
        )
    for name in found.strays:
        notice(Finding("journal-stray", f"journal/{name} is not a journal file; left alone"))
    if not read_data:
        return
    pool_id = pool.identity.pool_id if pool.identity is not None else None
    for entry in found.entries:
        if found.position.superseded(entry):
            continue
        try:
            pool.journal.read(entry, pool_id)
        except FileNotFoundError:
            continue  # superseded by a checkpoint since the listing
        except PermissionError as exc:
            problem(Finding("journal-unreadable", unreadable_reason(entry.name, exc)))
        except (JournalDamagedError, OSError) as exc:
            problem(Finding("journal-damaged", str(exc)))


def _recheck_unlisted(
    pool: PoolContext,
    rows: dict[str, Any],
    files: dict[str, int],
    not_files: dict[str, str],
) -> set[str]:
    """Look again at the blobs of ``rows`` that ``files`` (the listing) lacks.

    A file found now is added to ``files``; a path holding something other than a regular
    file (a FIFO, a symlink, a folder) is put in ``not_files`` with the store's message, and
    is neither read nor judged missing.  Returns the digests whose row changed since
    ``rows`` were read (gone, another state, re-created): their files may come and go
    legitimately, so their absence is no damage.  The file is looked at before the row is
    read again, so a missing file whose row did not change was missing while it was live.
    """
    absent = []
    for digest in sorted(d for d in rows if d not in files):
        try:
            files[digest] = pool.store.size(digest)
        except BlobNotFoundError:
            absent.append(digest)
        except IntegrityError as exc:
            not_files[digest] = str(exc)
    if not absent:
        return set()
    b = blobs_table
    now: dict[str, Any] = {}
    with pool.catalog.read() as conn:
        for batch in batches(absent, 500):
            for row in conn.execute(
                select(b.c.digest, b.c.state, b.c.created_at).where(b.c.digest.in_(batch))
            ):
                now[row.digest] = row
    return {
        d
        for d in absent
        if d not in now or (now[d].state, now[d].created_at) != (rows[d].state, rows[d].created_at)
    }
