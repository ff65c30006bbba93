"""What is retained: the one rule GC deletes by and verify, the owners audit and release plans
report by (docs/architecture/gc-protocol.md, "GC protocol").

A blob is retained while

* an archive that retains needs it (its ``archive_blobs`` rows): one that has an owner and is
  not a dead pending save (pending, its save's lease gone or expired: GC rolls it back before
  it deletes, so it holds nothing), or
* a live lease holds it (a save in flight, before its ownership commit).

A save in flight writes only blobs it needs (`in_flight`): those its live lease holds (step 2
of the save protocol) and those its pending archive needs while its lease lives: the manifest
(step 4) and the last chunks its ownership transaction claimed (step 3, "The last chunks go
with the manifest").  GC never removes an incomplete write (a temp file, a multipart upload)
of one of those, however old it looks.

Everything here is SQL, evaluated by the catalog inside the caller's transaction, so GC's
plan and the reports read the rule from one place and cannot drift apart (a release plan
that forgot the dead-pending rule once under-reported what a release frees).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import and_, exists, literal, not_, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from .._util.names import ARCHIVE_OWNER_PREFIX
from ..catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    lease_blobs_table,
    leases_table,
    retention_table,
)
from ..catalog.queries import batches

__all__ = [
    "dead_pending",
    "dead_pending_ids",
    "in_flight",
    "live_lease",
    "retained",
    "retained_digests",
]


def live_lease(now: float) -> ColumnElement[bool]:
    """SQL on ``leases``: the lease has not expired at ``now``."""
    return leases_table.c.expires_at > now


def dead_pending(now: float) -> ColumnElement[bool]:
    """SQL on ``archives``: a pending save whose lease is gone or expired at ``now``."""
    a, lt = archives_table, leases_table
    return and_(
        a.c.state == "pending",
        not_(exists().where(lt.c.owner == a.c.lease_owner, live_lease(now))),
    )


def retained(
    now: float,
    *,
    releasing: tuple[str, str | None] | None = None,
    releasing_ids: Collection[int] = (),
) -> ColumnElement[bool]:
    """SQL on ``blobs``: the current row's blob is retained at ``now``.

    ``releasing=(owner, name)`` asks what would stay retained once ``owner`` let go of archive
    ``name`` (of every archive it holds, for a name of None): its retention rows are left out.
    ``releasing_ids`` asks the same of the archives of those ids releasing their own owners
    (``archive:<name>``), as `ArchiveManager.forget` would.
    """
    ab, r, a, lb, lt = (
        archive_blobs_table,
        retention_table,
        archives_table,
        lease_blobs_table,
        leases_table,
    )
    holds = [ab.c.digest == blobs_table.c.digest, not_(dead_pending(now))]
    if releasing is not None:
        owner, name = releasing
        dropped = r.c.owner == owner if name is None else and_(r.c.owner == owner, a.c.name == name)
        holds.append(not_(dropped))
    if releasing_ids:
        own = literal(ARCHIVE_OWNER_PREFIX) + a.c.name
        holds.append(not_(and_(a.c.id.in_(list(releasing_ids)), r.c.owner == own)))
    by_archive = (
        select(ab.c.digest)
        .join(r, r.c.archive_id == ab.c.archive_id)
        .join(a, a.c.id == ab.c.archive_id)
        .where(*holds)
        .exists()
    )
    by_lease = (
        select(lb.c.digest)
        .join(lt, lt.c.owner == lb.c.lease)
        .where(lb.c.digest == blobs_table.c.digest, live_lease(now))
        .exists()
    )
    return or_(by_archive, by_lease)


def retained_digests(conn: Connection, now: float) -> set[str]:
    """Every blob row retained at ``now`` (by `retained`)."""
    return set(conn.execute(select(blobs_table.c.digest).where(retained(now))).scalars())


def dead_pending_ids(conn: Connection, now: float, ids: Iterable[int] | None = None) -> set[int]:
    """The archives (of ``ids``, or all) that are dead pending saves at ``now``."""
    a = archives_table
    query = select(a.c.id).where(dead_pending(now))
    if ids is not None:
        query = query.where(a.c.id.in_(list(ids)))
    return set(conn.execute(query).scalars())


def in_flight(conn: Connection, now: float, digests: Sequence[str]) -> set[str]:
    """Of ``digests``, those a save in flight at ``now`` may be writing: held by a live
    lease, or needed by a pending archive whose lease is live (its manifest, and the last
    chunks its ownership transaction claimed).

    NOTE: a save records the hold (or, for its manifest and last chunks, its pending
    archive) in a committed transaction before it begins the write, so an incomplete write
    listed before this query
    whose digest is not returned belongs to no live save: its save died, lapsed, or finished.
    Judging by its age alone once aborted a live save's multipart upload (an hour by the
    store's clock) and would remove a live temp file whose mtime a file server's clock set.
    """
    lb, lt, a, ab = lease_blobs_table, leases_table, archives_table, archive_blobs_table
    found: set[str] = set()
    for batch in batches(sorted(set(digests))):
        found.update(
            conn.execute(
                select(lb.c.digest)
                .join(lt, lt.c.owner == lb.c.lease)
                .where(lb.c.digest.in_(batch), live_lease(now))
            ).scalars()
        )
        found.update(
            conn.execute(
                select(ab.c.digest)
                .join(a, a.c.id == ab.c.archive_id)
                .join(lt, lt.c.owner == a.c.lease_owner)
                .where(a.c.state == "pending", ab.c.digest.in_(batch), live_lease(now))
            ).scalars()
        )
    return found
