"""What owners retain (docs/architecture/gc-protocol.md, "GC protocol"): the owners audit
(`ArchiveManager.owners`), what releasing an owner would free (`ArchiveManager.release_plan`)
and retention policies (`ArchiveManager.forget`, docs/architecture/gc-protocol.md, "Retention
policies").

Both only read, and both count as GC does: the rule of what is retained lives in
`archive_manager.pool.reachability`, and this module only attributes it to owners.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.engine import Connection

from .._util.holders import holder_status
from .._util.humanize import duration_seconds
from .._util.names import archive_owner
from ..catalog import (
    archive_blobs_table,
    archives_table,
    blobs_table,
    lease_blobs_table,
    leases_table,
    retention_table,
)
from ..catalog.queries import batches
from ..errors import InvalidInputError
from .context import PoolContext
from .listing import check_rollout_range
from .reachability import dead_pending_ids, live_lease, retained, retained_digests

__all__ = [
    "ForgetItem",
    "ForgetPlan",
    "OwnerUsage",
    "OwnersReport",
    "ReleasePlan",
    "SaveLease",
    "audit_owners",
    "plan_forget",
    "plan_release",
    "plan_release_names",
]


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
class SaveLease:
    """A save's lease and the process that holds it (docs/architecture/save-protocol.md, "Save
    protocol", Resuming a killed save): what a new save of ``archive`` would meet."""

    lease: str
    archive: str | None
    pending: bool  # the save committed its ownership: a pending archive row holds the name
    host: str | None
    pid: int | None
    status: str  # `holder_status`: "alive", "dead" or "unknown"
    expires_at: float
    expired: bool

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
    # Every save's lease with its holder, by lease (GC's own leases are not saves).
    saves: list[SaveLease] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "owners": [o.as_dict() for o in self.owners],
            "stale_leases": self.stale_leases,
            "live_leases": self.live_leases,
            "saves": [s.as_dict() for s in self.saves],
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
        leases = conn.execute(
            select(lt.c.owner, lt.c.expires_at, lt.c.archive_name, lt.c.holder)
        ).all()
        pending_leases = set(
            conn.execute(
                select(a.c.lease_owner).where(a.c.state == "pending", a.c.lease_owner.is_not(None))
            ).scalars()
        )
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
    report.stale_leases = sorted(row.owner for row in leases if row.owner not in live)
    report.saves = [
        _save_lease(row, row.owner in pending_leases, now)
        for row in sorted(leases, key=lambda row: row.owner)
        if row.archive_name is not None
    ]
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


def _save_lease(row: Any, pending: bool, now: float) -> SaveLease:
    holder = row.holder if isinstance(row.holder, dict) else {}
    pid = holder.get("pid")
    host = holder.get("host")
    return SaveLease(
        lease=row.owner,
        archive=row.archive_name,
        pending=pending,
        host=host if isinstance(host, str) else None,
        pid=pid if type(pid) is int else None,
        status=holder_status(row.holder),
        expires_at=float(row.expires_at),
        expired=row.expires_at <= now,
    )


@dataclass
class ForgetItem:
    """One archive in a `ForgetPlan`: why it is kept (the rules that keep it), or, when it is
    released, the other owners that still retain its payload."""

    name: str
    rollout_id: int | None
    evaluation: bool
    created_at: datetime
    kept_by: list[str] = field(default_factory=list)
    other_owners: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {**self.__dict__, "created_at": self.created_at.isoformat()}


@dataclass
class ForgetPlan:
    """`ArchiveManager.forget`: a retention policy applied to the published archives in its
    scope (restic's ``forget``): which are kept, by which rule, and which are released.

    ``freed_blobs``/``freed_bytes`` are what nothing retains once the released archives let
    go (what the next GC past its grace period reclaims); an archive another owner (a
    checkpoint, a queue) still retains is released all the same but lists those owners in
    ``other_owners`` and frees nothing while they hold it.  ``released`` names what the call
    released (empty for a dry run, or when another process released them first).

    `ArchiveManager.release` returns the same shape for the archives it was given: its
    ``policy`` lists them (``{"archives": [...]}``), ``keep`` is empty, and those released
    before are in ``already_released``.
    """

    policy: dict[str, Any]
    keep: list[ForgetItem] = field(default_factory=list)
    release: list[ForgetItem] = field(default_factory=list)
    freed_blobs: int = 0
    freed_bytes: int = 0
    dry_run: bool = True
    released: list[str] = field(default_factory=list)
    already_released: list[str] = field(default_factory=list)

    @property
    def still_retained(self) -> dict[str, list[str]]:
        """The archives to release that other owners still retain, with those owners."""
        return {i.name: i.other_owners for i in self.release if i.other_owners}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "policy": self.policy,
            "keep": [i.as_dict() for i in self.keep],
            "release": [i.as_dict() for i in self.release],
            "freed_blobs": self.freed_blobs,
            "freed_bytes": self.freed_bytes,
            "dry_run": self.dry_run,
            "released": self.released,
            "already_released": self.already_released,
        }


def _positive(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{what} must be an int of 1 or more, not {value!r:.40}")
    return value


def plan_forget(
    pool: PoolContext,
    *,
    keep_last: int | None = None,
    keep_within: timedelta | float | str | None = None,
    keep_every: int | None = None,
    rollout_ids: object = None,
    evaluation: bool | None = None,
) -> tuple[ForgetPlan, list[int]]:
    """Plan a retention policy (see `ForgetPlan`); changes nothing.

    The scope is the published archives whose rollout id is in ``rollout_ids`` (an int, a
    ``range`` or an inclusive ``(low, high)`` with optional ends; archives without a rollout
    id are outside any range) and whose evaluation flag is ``evaluation`` (None: both).
    Archives outside it are neither kept nor released.  Inside it, an archive is kept when a
    rule keeps it:

    * ``keep_last=N``: the N newest, by rollout id, then creation time (archives without a
      rollout id rank below every numbered one);
    * ``keep_within=D``: created within D of the newest archive in scope, not of now (as
      restic does): a run that stopped a week ago keeps its last D of archives;
    * ``keep_every=K``: its rollout id is a multiple of K (every K-th rollout).

    Returns:
        The plan, and the catalog ids of the archives to release, in the plan's order.

    Raises:
        InvalidInputError: no rule given (releasing a whole scope needs ``release``, not a
            policy), or a rule or scope of the wrong type or out of range.
    """
    last = _positive(keep_last, "keep_last")
    every = _positive(keep_every, "keep_every")
    try:
        within = None if keep_within is None else duration_seconds(keep_within, "keep_within")
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    if last is None and every is None and within is None:
        raise InvalidInputError(
            "give at least one rule (keep_last, keep_within, keep_every): a policy without "
            "one would release every archive in its scope"
        )
    bounds = check_rollout_range(rollout_ids)
    if evaluation is not None and not isinstance(evaluation, bool):
        raise InvalidInputError("evaluation must be a bool or None")
    policy: dict[str, Any] = {
        "keep_last": last,
        "keep_within": within,
        "keep_every": every,
        "rollout_ids": list(bounds) if bounds is not None else None,
        "evaluation": evaluation,
    }

    a = archives_table
    query = select(a.c.id, a.c.name, a.c.rollout_id, a.c.evaluation, a.c.created_at).where(
        a.c.state == "published"
    )
    if bounds is not None:
        low, high = bounds
        if low is not None:
            query = query.where(a.c.rollout_id >= low)
        if high is not None:
            query = query.where(a.c.rollout_id <= high)
    if evaluation is not None:
        query = query.where(a.c.evaluation == evaluation)
    now = pool.clock()
    with pool.catalog.read() as conn:
        rows = list(conn.execute(query).all())
        # Newest first: rollout id, then creation time; the name breaks ties stably.
        rows.sort(
            key=lambda row: (
                row.rollout_id is not None,
                row.rollout_id or 0,
                row.created_at,
                row.name,
            ),
            reverse=True,
        )
        newest = max((row.created_at for row in rows), default=0.0)
        keep: list[ForgetItem] = []
        release: list[tuple[int, ForgetItem]] = []
        for rank, row in enumerate(rows):
            item = ForgetItem(
                row.name,
                row.rollout_id,
                bool(row.evaluation),
                datetime.fromtimestamp(row.created_at, tz=timezone.utc),
            )
            if last is not None and rank < last:
                item.kept_by.append("keep-last")
            if within is not None and row.created_at >= newest - within:
                item.kept_by.append("keep-within")
            if every is not None and row.rollout_id is not None and row.rollout_id % every == 0:
                item.kept_by.append("keep-every")
            if item.kept_by:
                keep.append(item)
            else:
                release.append((row.id, item))
        plan = ForgetPlan(policy=policy, keep=keep)
        _plan_releases(conn, now, plan, release)
    return plan, [i for i, _ in release]


def plan_release_names(pool: PoolContext, ids: Sequence[int]) -> ForgetPlan:
    """The plan of releasing the archives of ``ids`` (`ArchiveManager.release`): each one
    to release with the other owners that retain it, those already released, and what
    nothing retains once they let go."""
    a = archives_table
    now = pool.clock()
    plan = ForgetPlan(policy={"archives": []})
    with pool.catalog.read() as conn:
        rows = {
            row.id: row
            for batch in batches(list(ids))
            for row in conn.execute(
                select(
                    a.c.id, a.c.name, a.c.rollout_id, a.c.evaluation, a.c.created_at, a.c.state
                ).where(a.c.id.in_(batch))
            )
        }
        release: list[tuple[int, ForgetItem]] = []
        for archive_id in ids:
            row = rows.get(archive_id)
            if row is None:
                continue
            plan.policy["archives"].append(row.name)
            if row.state != "published":
                plan.already_released.append(row.name)
                continue
            item = ForgetItem(
                row.name,
                row.rollout_id,
                bool(row.evaluation),
                datetime.fromtimestamp(row.created_at, tz=timezone.utc),
            )
            release.append((archive_id, item))
        _plan_releases(conn, now, plan, release)
    return plan


def _plan_releases(
    conn: Connection, now: float, plan: ForgetPlan, release: list[tuple[int, ForgetItem]]
) -> None:
    """Fill ``plan.release`` from ``(archive id, item)`` pairs: each item's other owners, and
    the blobs and bytes nothing retains once they all let go, by GC's own rule
    (docs/architecture/gc-protocol.md, "GC protocol")."""
    r, ab, b = retention_table, archive_blobs_table, blobs_table
    ids = [i for i, _ in release]
    holders: dict[int, list[str]] = defaultdict(list)
    for batch in batches(ids):
        for owner, archive_id in conn.execute(
            select(r.c.owner, r.c.archive_id).where(r.c.archive_id.in_(batch))
        ):
            holders[archive_id].append(owner)
    for archive_id, item in release:
        own = archive_owner(item.name)
        item.other_owners = sorted(o for o in holders[archive_id] if o != own)
    plan.release = [item for _, item in release]
    if not ids:
        return
    needed = select(ab.c.digest).where(ab.c.digest == b.c.digest, ab.c.archive_id.in_(ids))
    sizes = list(
        conn.execute(
            select(b.c.size).where(
                b.c.state == "live", exists(needed), ~retained(now, releasing_ids=ids)
            )
        ).scalars()
    )
    plan.freed_blobs = len(sizes)
    plan.freed_bytes = sum(sizes)
