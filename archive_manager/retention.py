"""What owners retain (docs/architecture.md, "GC protocol"): the owners audit
(`ArchiveManager.owners`) and what releasing an owner would free (`ArchiveManager.release_plan`).

Both only read, and both count as GC does: the rule of what is retained lives in
`archive_manager.reachability`, and this module only attributes it to owners.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exists, select

from ._context import PoolContext
from .catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    lease_blobs_table,
    leases_table,
    retention_table,
)
from .reachability import dead_pending_ids, live_lease, retained, retained_digests

__all__ = ["OwnerUsage", "OwnersReport", "ReleasePlan", "audit_owners", "plan_release"]


@dataclass
class ReleasePlan:
    """The archives an owner would let go of, and the blobs and bytes that nothing else
    would retain afterwards (what the next GC past the grace period would reclaim)."""

    owner: str
    archives: list[str] = field(default_factory=list)
    still_retained: dict[str, list[str]] = field(default_factory=dict)
    blobs: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return dict(self.__dict__)


def plan_release(pool: PoolContext, *, owner: str, archive: str | None = None) -> ReleasePlan:
    """Plan dropping ``owner``'s retention (of ``archive`` only, when given)."""
    r, a, ab, b = retention_table, archives_table, archive_blobs_table, blobs_table
    now = pool.clock()
    with pool.catalog.read() as conn:
        names = dict(conn.execute(select(a.c.id, a.c.name)).all())
        holdings: dict[int, set[str]] = defaultdict(set)
        for o, archive_id in conn.execute(select(r.c.owner, r.c.archive_id)):
            holdings[archive_id].add(o)
        dropped = {
            i
            for i, owners in holdings.items()
            if owner in owners and (archive is None or names.get(i) == archive)
        }
        # Freed: a live blob one of the dropped archives needs that nothing retains once the
        # owner let go, by GC's own rule (a dead pending save that needs it too keeps
        # nothing: GC rolls it back first).
        needed_by_dropped = (
            select(ab.c.digest)
            .join(r, r.c.archive_id == ab.c.archive_id)
            .join(a, a.c.id == ab.c.archive_id)
            .where(ab.c.digest == b.c.digest, r.c.owner == owner)
        )
        if archive is not None:
            needed_by_dropped = needed_by_dropped.where(a.c.name == archive)
        freed = conn.execute(
            select(b.c.size).where(
                b.c.state == "live",
                exists(needed_by_dropped),
                ~retained(now, releasing=(owner, archive)),
            )
        ).scalars()
        sizes = list(freed)
    plan = ReleasePlan(owner=owner, archives=sorted(names[i] for i in dropped))
    plan.still_retained = {
        names[i]: sorted(holdings[i] - {owner}) for i in sorted(dropped) if holdings[i] - {owner}
    }
    plan.blobs = len(sizes)
    plan.bytes = sum(sizes)
    return plan


@dataclass
class OwnerUsage:
    """What one owner retains."""

    owner: str
    archives: list[str]
    blobs: int
    bytes: int
    exclusive_bytes: int
    shared_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return dict(self.__dict__)


@dataclass
class OwnersReport:
    """The retention audit: per owner, and what awaits GC."""

    owners: list[OwnerUsage] = field(default_factory=list)
    stale_leases: list[str] = field(default_factory=list)
    live_leases: list[str] = field(default_factory=list)
    unowned_blobs: int = 0
    unowned_bytes: int = 0
    released_with_payload: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "owners": [o.as_dict() for o in self.owners],
            "stale_leases": self.stale_leases,
            "live_leases": self.live_leases,
            "unowned_blobs": self.unowned_blobs,
            "unowned_bytes": self.unowned_bytes,
            "released_with_payload": self.released_with_payload,
        }


def audit_owners(pool: PoolContext) -> OwnersReport:
    """Per owner: archives, blobs, bytes retained, exclusive and shared (see `OwnerUsage`)."""
    now = pool.clock()
    b, a, ab, r, lt = (
        blobs_table,
        archives_table,
        archive_blobs_table,
        retention_table,
        leases_table,
    )
    with pool.catalog.read() as conn:
        sizes = {
            d: s
            for d, s, st in conn.execute(select(b.c.digest, b.c.size, b.c.state))
            if st != "deleting"
        }
        names = dict(conn.execute(select(a.c.id, a.c.name)).all())
        states = dict(conn.execute(select(a.c.id, a.c.state)).all())
        needs: dict[int, set[str]] = defaultdict(set)
        for archive_id, digest in conn.execute(select(ab.c.archive_id, ab.c.digest)):
            needs[archive_id].add(digest)
        holdings: dict[str, set[int]] = defaultdict(set)
        for owner, archive_id in conn.execute(select(r.c.owner, r.c.archive_id)):
            holdings[owner].add(archive_id)
        leases = conn.execute(select(lt.c.owner, lt.c.expires_at)).all()
        live = set(conn.execute(select(lt.c.owner).where(live_lease(now))).scalars())
        lease_blobs: dict[str, set[str]] = defaultdict(set)
        for lease, digest in conn.execute(
            select(lease_blobs_table.c.lease, lease_blobs_table.c.digest)
        ):
            lease_blobs[lease].add(digest)
        # Retained as GC counts it: expired leases and the pending saves they guarded hold
        # nothing (GC drops and rolls them back first), so their blobs count as unowned.
        dead = dead_pending_ids(conn, now)
        kept = retained_digests(conn, now)

    owner_blobs: dict[str, set[str]] = {}
    for owner, ids in holdings.items():
        ids = ids - dead
        if ids:
            owner_blobs[owner] = set().union(*(needs.get(i, set()) for i in ids)) & sizes.keys()
    for lease in live:
        owner_blobs.setdefault(lease, set()).update(lease_blobs.get(lease, set()) & sizes.keys())
    holders: dict[str, int] = defaultdict(int)
    for digests in owner_blobs.values():
        for d in digests:
            holders[d] += 1

    report = OwnersReport()
    for owner in sorted(owner_blobs):
        digests = owner_blobs[owner]
        exclusive = sum(sizes[d] for d in digests if holders[d] == 1)
        total = sum(sizes[d] for d in digests)
        report.owners.append(
            OwnerUsage(
                owner,
                sorted(names[i] for i in holdings.get(owner, set()) - dead),
                len(digests),
                total,
                exclusive,
                total - exclusive,
            )
        )
    report.stale_leases = sorted(o for o, _ in leases if o not in live)
    report.live_leases = sorted(live)
    unowned = [d for d in sizes if d not in kept]
    report.unowned_blobs = len(unowned)
    report.unowned_bytes = sum(sizes[d] for d in unowned)
    report.released_with_payload = sorted(
        names[i]
        for i, st in states.items()
        if st == "released" and needs.get(i) and needs[i] <= sizes.keys()
    )
    return report
