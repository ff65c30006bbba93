"""The catalog statements of the save, read and retention protocols.

Each function runs inside a transaction its caller opened with `Catalog.read` or
`Catalog.write`; none opens or commits one, and none touches a file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, and_, bindparam, delete, exists, func, or_, select, update
from sqlalchemy.engine import Connection, CursorResult, Row

from .._util.constants import SAVE_SEQ
from .._util.names import name_spellings
from .._util.pool_files import MAX_JOURNAL_SEQ
from ..errors import CatalogError, LeaseExpiredError
from .bulk import insert_rows
from .models import (
    CURRENT_STATES,
    archive_blobs_table,
    archives_table,
    blobs_table,
    lease_blobs_table,
    leases_table,
    pool_info_table,
    retention_table,
    task_texts_table,
)

__all__ = [
    "IN_BATCH",
    "archive_by_name",
    "archive_bytes",
    "archive_rows_by_name",
    "archives_in_order",
    "archives_named",
    "batches",
    "blob_rows",
    "check_lease",
    "drop_lease",
    "hold_blobs",
    "insert_lease",
    "inserted_id",
    "mark_live",
    "next_save_seq",
    "pick_archive",
    "raise_save_seq",
    "renew_lease",
    "stored_owner",
    "stored_save_seq",
    "task_texts_of",
]


T = TypeVar("T")

# NOTE: SQLite allows 32766 bound parameters per statement; IN lists are cut well below it.
IN_BATCH = 5000


def batches(values: Sequence[T], size: int = IN_BATCH) -> Iterator[Sequence[T]]:
    """``values`` cut in consecutive slices of at most ``size``: one IN list, or one
    transaction of a protocol that works batch by batch, each."""
    for i in range(0, len(values), size):
        yield values[i : i + size]


# NOTE: the statements every save runs, built once: a statement built per call cost its
# construction and cache key each time (~80 µs a statement on this project's VM, ~40 of a
# small save's statements; docs/performance.md, "Small saves"), a prebuilt one only its
# parameters.
_INSERT_LEASE = leases_table.insert()
_LEASE_EXPIRY = select(leases_table.c.expires_at).where(leases_table.c.owner == bindparam("owner"))
_DROP_LEASE_BLOBS = delete(lease_blobs_table).where(lease_blobs_table.c.lease == bindparam("owner"))
_DROP_LEASE = delete(leases_table).where(leases_table.c.owner == bindparam("owner"))
_HELD = select(lease_blobs_table.c.digest).where(
    lease_blobs_table.c.lease == bindparam("lease"),
    lease_blobs_table.c.digest.in_(bindparam("digests", expanding=True)),
)
_BLOB_ROWS = select(
    blobs_table.c.digest, blobs_table.c.size, blobs_table.c.kind, blobs_table.c.state
).where(blobs_table.c.digest.in_(bindparam("digests", expanding=True)))
_MARK_LIVE = (
    update(blobs_table)
    .where(
        blobs_table.c.digest.in_(bindparam("digests", expanding=True)),
        blobs_table.c.state == "writing",
    )
    .values(state="live")
)
_ARCHIVES_NAMED = select(archives_table).where(
    archives_table.c.name.in_(bindparam("names", expanding=True)),
    archives_table.c.state.in_(bindparam("states", expanding=True)),
)
_POOL_INFO = select(pool_info_table.c.value).where(pool_info_table.c.key == bindparam("key"))
_SET_POOL_INFO = (
    update(pool_info_table)
    .where(pool_info_table.c.key == bindparam("info_key"))
    .values(value=bindparam("info_value"))
)


def insert_lease(
    conn: Connection,
    owner: str,
    *,
    now: float,
    ttl: float,
    archive_name: str | None = None,
    holder: Mapping[str, Any] | None = None,
) -> None:
    """Start a lease that expires ``ttl`` seconds after ``now``; ``holder`` is the process
    that holds it (``_util.holders.this_process``)."""
    conn.execute(
        _INSERT_LEASE,
        {
            "owner": owner,
            "expires_at": now + ttl,
            "generation": 1,
            "created_at": now,
            "archive_name": archive_name,
            "holder": None if holder is None else dict(holder),
        },
    )


def renew_lease(conn: Connection, owner: str, *, now: float, ttl: float) -> float:
    """Extend a live lease to ``now + ttl``; return the new expiry.

    Raises:
        LeaseExpiredError: the lease lapsed (or GC already dropped it): its holder must not
            go on, since GC may have reclaimed what it held.
    """
    result = conn.execute(
        update(leases_table)
        .where(leases_table.c.owner == owner, leases_table.c.expires_at > now)
        .values(expires_at=now + ttl, generation=leases_table.c.generation + 1)
    )
    if result.rowcount != 1:
        raise LeaseExpiredError(
            f"{owner} expired before the save could go on; nothing was published "
            "(a paused or very slow writer must not publish over reclaimed blobs)"
        )
    return now + ttl


def check_lease(conn: Connection, owner: str, *, now: float) -> float:
    """Return the lease's expiry if it is still live, else raise `LeaseExpiredError`."""
    expires: float | None = conn.execute(_LEASE_EXPIRY, {"owner": owner}).scalar_one_or_none()
    if expires is None or expires <= now:
        raise LeaseExpiredError(
            f"{owner} expired before the save could commit; nothing was published "
            "(a paused or very slow writer must not publish over reclaimed blobs)"
        )
    return expires


def drop_lease(conn: Connection, owner: str, *, holds: bool = True) -> None:
    """Delete a lease and every blob retention it held; ``holds=False``: a lease known to
    hold none (a save's, once its ownership commit dropped them), one statement less."""
    if holds:
        conn.execute(_DROP_LEASE_BLOBS, {"owner": owner})
    conn.execute(_DROP_LEASE, {"owner": owner})


def hold_blobs(conn: Connection, lease: str, digests: Collection[str]) -> None:
    """Record that ``lease`` retains ``digests`` (those it holds already are skipped)."""
    wanted = sorted(set(digests))
    held: set[str] = set()
    for batch in batches(wanted):
        held.update(conn.execute(_HELD, {"lease": lease, "digests": list(batch)}).scalars())
    rows = [(lease, d) for d in wanted if d not in held]
    if rows:
        insert_rows(conn, lease_blobs_table, ("lease", "digest"), rows)


def blob_rows(conn: Connection, digests: Collection[str]) -> dict[str, Row[Any]]:
    """The catalog rows (digest, size, kind, state) of those ``digests`` that have one."""
    found: dict[str, Row[Any]] = {}
    wanted = sorted(set(digests))
    row: Any
    for batch in batches(wanted):
        for row in conn.execute(_BLOB_ROWS, {"digests": list(batch)}):
            found[row.digest] = row
    return found


def mark_live(conn: Connection, digests: Collection[str]) -> None:
    """Flip ``writing`` rows to ``live`` once their files are durable."""
    for batch in batches(sorted(set(digests))):
        conn.execute(_MARK_LIVE, {"digests": list(batch)})


def archive_by_name(conn: Connection, name: str, *, pending: bool = False) -> Row[Any] | None:
    """The archive row the name ``name`` points at (published or released), else the pending
    save of that name, or None; with ``pending``, the pending save of that name only.  An
    archive the name pointed at before it was saved again (superseded) is never returned
    (see `archives_named`).

    ``name`` is tried as given, then in NFC and NFD (`name_spellings`): new names are stored
    in NFC, and a name an older version stored in another form stays reachable by it.
    """
    spellings = name_spellings(name)
    states = ("pending",) if pending else (*CURRENT_STATES, "pending")
    rows = conn.execute(_ARCHIVES_NAMED, {"names": list(spellings), "states": list(states)}).all()
    return _pick_by_name(spellings, rows)


def archive_rows_by_name(conn: Connection, name: str) -> tuple[tuple[str, ...], list[Row[Any]]]:
    """The spellings of ``name`` and the rows of the archives a spelling points at and of
    their pending saves, in one statement: `pick_archive` then answers what `archive_by_name`
    would, with or without ``pending``, and again once a row is gone (a save's check of its
    name, `writer.free_name`, which needs both and may roll the pending save back)."""
    spellings = name_spellings(name)
    states = [*CURRENT_STATES, "pending"]
    rows = conn.execute(_ARCHIVES_NAMED, {"names": list(spellings), "states": states}).all()
    return tuple(spellings), list(rows)


def pick_archive(
    spellings: Sequence[str], rows: Sequence[Row[Any]], *, pending: bool = False
) -> Row[Any] | None:
    """Of the rows `archive_rows_by_name` read, the one `archive_by_name` returns."""
    return _pick_by_name(spellings, [r for r in rows if r.state == "pending"] if pending else rows)


def _pick_by_name(spellings: Sequence[str], rows: Sequence[Row[Any]]) -> Row[Any] | None:
    """Of the archive ``rows`` of a name's ``spellings``, the one `archive_by_name` returns."""
    by_name: dict[str, Row[Any]] = {}
    # NOTE: one current row and one pending row per name at most (the partial unique
    # indexes of revision 0010); the current one first.
    for row in sorted(rows, key=lambda row: row.state == "pending"):
        by_name.setdefault(row.name, row)
    return next((by_name[s] for s in spellings if s in by_name), None)


def archives_named(conn: Connection, name: str) -> list[Row[Any]]:
    """Every archive row named ``name`` (its stored spelling, as `archive_by_name` finds
    it), oldest first: those it superseded, the one it points at, a save of it pending."""
    a = archives_table
    spellings = name_spellings(name)
    rows = conn.execute(select(a).where(a.c.name.in_(spellings)).order_by(a.c.id)).all()
    stored = next((s for s in spellings if any(row.name == s for row in rows)), None)
    return [row for row in rows if row.name == stored]


def stored_owner(conn: Connection, owner: str) -> str:
    """The spelling of ``owner`` that retention rows hold (see `archive_by_name`): the
    exact string if any row holds it, else its NFC or NFD form if one does, else
    ``owner`` unchanged."""
    spellings = name_spellings(owner)
    held = set(
        conn.execute(
            select(retention_table.c.owner).where(retention_table.c.owner.in_(spellings)).distinct()
        ).scalars()
    )
    return next((s for s in spellings if s in held), owner)


def archive_bytes(conn: Connection, archive_ids: Sequence[int]) -> Mapping[int, int]:
    """Bytes of the blobs each archive needs (chunks, tensors, manifest), by archive id."""
    ab, b = archive_blobs_table, blobs_table
    out: dict[int, int] = {}
    for batch in batches(list(archive_ids)):
        rows = conn.execute(
            select(ab.c.archive_id, func.coalesce(func.sum(b.c.size), 0))
            .join(b, b.c.digest == ab.c.digest)
            .where(ab.c.archive_id.in_(batch))
            .group_by(ab.c.archive_id)
        )
        out.update({archive_id: int(total) for archive_id, total in rows})
    return out


def is_retained(conn: Connection, archive_id: int) -> bool:
    """Whether any owner retains the archive."""
    return bool(
        conn.execute(select(exists().where(retention_table.c.archive_id == archive_id))).scalar()
    )


def stored_save_seq(conn: Connection) -> int:
    """The last number the pool's counter gave (0 for none)."""
    value = conn.execute(_POOL_INFO, {"key": SAVE_SEQ}).scalar_one_or_none()
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _store_seq(conn: Connection, seq: int) -> None:
    if conn.execute(_SET_POOL_INFO, {"info_key": SAVE_SEQ, "info_value": str(seq)}).rowcount == 0:
        conn.execute(pool_info_table.insert().values(key=SAVE_SEQ, value=str(seq)))


def next_save_seq(conn: Connection, now: float, *, floor: int) -> int:
    """The next save number: above every number given before and above ``floor`` (the
    journal's newest verified number, `pool.journal.Journal.high_water`), and at least
    ``now`` in microseconds (inside a write transaction, which serialises the callers).

    NOTE: a counter alone would restart from an old value in a catalog restored from a
    backup (or a lagging replica after a failover), and hand out numbers below those that
    decisions made after the backup already carry: the floor, read from the journal before
    every decision, keeps numbers rising past them.  The clock is a floor too, never the
    order: after a clock ahead (a VM before NTP stepped it back) numbers go on from the last
    one, so no number says when a decision was made, only in which order (records carry
    their time).

    Raises:
        CatalogError: the number would pass the journal format's limit (`MAX_JOURNAL_SEQ`):
            a record named past it would be no journal file, so the decision is refused.
    """
    seq = max(stored_save_seq(conn) + 1, floor + 1, int(now * 1_000_000))
    if seq > MAX_JOURNAL_SEQ:
        raise CatalogError(
            f"the pool's decision counter would pass the journal format's limit ({seq} > "
            f"{MAX_JOURNAL_SEQ}): nothing was changed; a journal file numbered near the "
            "limit (journal/ in the blob root) moved it there; report it"
        )
    _store_seq(conn, seq)
    return seq


def raise_save_seq(conn: Connection, seen: int) -> None:
    """Make every later save number exceed ``seen`` (a rebuild found manifests up to it)."""
    if seen > stored_save_seq(conn):
        _store_seq(conn, seen)


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key of the one row an ``INSERT`` just added."""
    key = result.inserted_primary_key
    if key is None or key[0] is None:  # pragma: no cover - a single-row insert always has one
        raise RuntimeError("the insert returned no primary key")
    return int(key[0])


ArchiveKey = tuple[int | None, str]
"""Where an archive stands in listings: ``(rollout_id, name)``; None rollout ids last."""


def archives_in_order(
    conn: Connection,
    query: Select[Any],
    *,
    after: ArchiveKey | None = None,
    limit: int | None = None,
    unnumbered: bool = True,
) -> list[Row[Any]]:
    """The rows of ``query`` (a select from ``archives`` with its filters) by rollout id,
    archives without one last, then name; only those after the key ``after`` (keyset
    paging), at most ``limit``.  ``unnumbered=False`` skips the archives without a rollout
    id (a query with a rollout-id range holds none).

    NOTE: two statements, the archives with a rollout id then those without, each ordered
    by plain columns, so the ``(state, rollout_id, name)`` index yields the rows in order and
    a page reads only its rows however deep it is (docs/architecture/summaries-and-paging.md,
    "Summaries and paging"); ``ORDER BY rollout_id IS NULL`` would sort every matching archive per
    page.
    """
    a = archives_table
    rows: list[Row[Any]] = []
    if after is None or after[0] is not None:
        part = query.where(a.c.rollout_id.is_not(None))
        if after is not None:
            rollout_id, name = after
            part = part.where(
                or_(
                    a.c.rollout_id > rollout_id, and_(a.c.rollout_id == rollout_id, a.c.name > name)
                )
            )
        part = part.order_by(a.c.rollout_id, a.c.name, a.c.id)
        rows += conn.execute(part if limit is None else part.limit(limit)).all()
    if unnumbered and (limit is None or len(rows) < limit):
        part = query.where(a.c.rollout_id.is_(None))
        if after is not None and after[0] is None:
            part = part.where(a.c.name > after[1])
        part = part.order_by(a.c.name, a.c.id)
        rows += conn.execute(part if limit is None else part.limit(limit - len(rows))).all()
    if limit is not None and rows and len(rows) == limit:
        rows = _whole_last_name(conn, query, rows)
    return rows


def _whole_last_name(conn: Connection, query: Select[Any], rows: list[Row[Any]]) -> list[Row[Any]]:
    """A full page holds every archive of its last key ``(rollout_id, name)`` (the archives a
    name superseded beside the one it points at, or its pending save: revision 0010): the
    next page starts after that key.  So a page whose last key has more archives beyond it
    ends before that key (the next page starts with them), or, when the whole page is of
    that key, holds them all (more than ``limit``)."""
    a = archives_table
    last = rows[-1]
    key = a.c.rollout_id.is_(None) if last.rollout_id is None else a.c.rollout_id == last.rollout_id
    more = conn.execute(
        query.where(key, a.c.name == last.name, a.c.id > last.id).order_by(a.c.id)
    ).all()
    if not more:
        return rows
    first = next(
        i
        for i, row in enumerate(rows)
        if (row.rollout_id, row.name) == (last.rollout_id, last.name)
    )
    return rows[:first] if first else [*rows, *more]


def task_texts_of(
    conn: Connection, keys: Iterable[str | None], archive_id: int | None = None
) -> dict[str, str]:
    """The whole text of each of ``keys`` that is the digest of a long text (`task_texts`),
    of archive ``archive_id`` or, without it, of any archive (one text has one key)."""
    from ..samples.keys import TASK_TEXT_PREFIX

    t = task_texts_table
    wanted = sorted({k for k in keys if k is not None and k.startswith(TASK_TEXT_PREFIX)})
    found: dict[str, str] = {}
    for batch in batches(wanted):
        query = select(t.c.task_key, t.c.text).where(t.c.task_key.in_(batch))
        if archive_id is not None:
            query = query.where(t.c.archive_id == archive_id)
        for key, text in conn.execute(query):
            found.setdefault(key, text)
    return found
