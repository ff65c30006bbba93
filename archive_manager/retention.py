"""What releasing an owner would free: a read-only plan (`ArchiveManager.release_plan`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from ._context import PoolContext
from .catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    lease_blobs_table,
    leases_table,
    retention_table,
)

__all__ = ["ReleasePlan", "plan_release"]


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
        remaining = {
            i for i, owners in holdings.items() if owners - ({owner} if i in dropped else set())
        }
        needs: dict[str, set[int]] = defaultdict(set)
        for archive_id, digest in conn.execute(select(ab.c.archive_id, ab.c.digest)):
            needs[digest].add(archive_id)
        leased = set(
            conn.execute(
                select(lease_blobs_table.c.digest)
                .join(leases_table, leases_table.c.owner == lease_blobs_table.c.lease)
                .where(leases_table.c.expires_at > now)
            ).scalars()
        )
        sizes = dict(conn.execute(select(b.c.digest, b.c.size).where(b.c.state == "live")).all())
    plan = ReleasePlan(owner=owner, archives=sorted(names[i] for i in dropped))
    plan.still_retained = {
        names[i]: sorted(holdings[i] - {owner}) for i in sorted(dropped) if holdings[i] - {owner}
    }
    freed = [
        d
        for d, holders in needs.items()
        if holders & dropped and not holders & remaining and d not in leased and d in sizes
    ]
    plan.blobs = len(freed)
    plan.bytes = sum(sizes[d] for d in freed)
    return plan
