"""Catalog-only questions about a pool: its summary, and samples across archives filtered by
key, status, reward, length and rollout id.  No blob is read."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sqlalchemy import Select, func, literal, select
from sqlalchemy.engine import Connection

from ..catalog import (
    FORMAT_VERSION,
    STATUS_LENGTH,
    archive_blobs_table,
    archives_table,
    blobs_table,
    current_revision,
    entries_table,
    get_pool_info,
    sample_metadata_table,
)
from ..catalog.engine import shown_url
from ..catalog.queries import IN_BATCH, ArchiveKey, archives_in_order, batches
from ..errors import ArchiveNotFoundError, ArchiveReleasedError, InvalidInputError
from ..pool.archive import Archive, payload_gone, reclaimed_names
from ..pool.context import PoolContext
from ..pool.summary import ArchiveSummary, read_summaries
from ..samples import check_key_text, check_task_key
from .rewards import check_reward_key, reward_column

__all__ = ["PoolSummary", "SampleRow", "SampleRows", "load_rows", "pool_summary", "query_samples"]


@dataclass
class PoolSummary:
    """`ArchiveManager.info`: what a pool holds."""

    root: str
    catalog_url: str
    format_version: int
    catalog_revision: str | None
    archives: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    blobs: dict[str, int] = field(default_factory=dict)
    stored_bytes: int = 0
    logical_bytes: int = 0
    unique_bytes: int = 0

    @property
    def dedup_ratio(self) -> float:
        """Bytes the published archives reference (each archive counting its blobs) over the
        bytes of the distinct blobs they need (each blob once): 1.0 without sharing, never
        below it.  Blobs awaiting GC (released archives, dead saves) are in ``stored_bytes``
        and do not lower it."""
        return self.logical_bytes / self.unique_bytes if self.unique_bytes else 1.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {**self.__dict__, "dedup_ratio": self.dedup_ratio}


def pool_summary(pool: PoolContext) -> PoolSummary:
    """Archives by state, blobs by state, stored and referenced bytes."""
    a, b = archives_table, blobs_table
    with pool.catalog.read() as conn:
        summary = PoolSummary(
            root=str(pool.root),
            catalog_url=shown_url(pool.catalog_url),
            format_version=int(get_pool_info(conn, "format_version") or FORMAT_VERSION),
            catalog_revision=current_revision(conn),
        )
        summary.archives = {
            s: n for s, n in conn.execute(select(a.c.state, func.count()).group_by(a.c.state))
        }
        summary.samples = int(
            conn.execute(
                select(func.coalesce(func.sum(a.c.samples), 0)).where(a.c.state == "published")
            ).scalar_one()
        )
        for state, count, size in conn.execute(
            select(b.c.state, func.count(), func.coalesce(func.sum(b.c.size), 0)).group_by(
                b.c.state
            )
        ):
            summary.blobs[state] = int(count)
            if state == "live":
                summary.stored_bytes = int(size)
        summary.logical_bytes = int(
            conn.execute(
                select(func.coalesce(func.sum(a.c.bytes), 0)).where(a.c.state == "published")
            ).scalar_one()
        )
        ab = archive_blobs_table
        # NOTE: the first published archive needing the blob, as a scalar subquery with LIMIT
        # 1 rather than EXISTS: PostgreSQL made the EXISTS a hash semi-join over every
        # archive_blobs row (170,000 at 10,000 archives: 0.2 s); this probes the (digest,
        # archive_id) index once per blob and stops at the first match (0.12 s), as SQLite
        # runs either.
        needer = (
            select(literal(1))
            .select_from(ab.join(a, a.c.id == ab.c.archive_id))
            .where(ab.c.digest == b.c.digest, a.c.state == "published")
            .limit(1)
            .scalar_subquery()
        )
        summary.unique_bytes = int(
            conn.execute(
                select(func.coalesce(func.sum(b.c.size), 0)).where(needer.is_not(None))
            ).scalar_one()
        )
    return summary


@dataclass(frozen=True)
class SampleRow:
    """One sample found by `query_samples`: where it is, its keys and its metadata."""

    archive: str
    rollout_id: int | None
    evaluation: bool
    position: int
    sample_key: str
    task_key: str | None
    status: str | None
    reward: float | None
    response_length: int | None
    metadata: dict[str, Any]
    # The catalog's id of the archive: `load_rows` reads that very archive, not a later
    # one saved under the same name (after a forget); None in rows made by hand.
    archive_id: int | None = field(default=None, repr=False, compare=False)
    # The part of a dict reward read as ``reward``: the key the query was given, else the one
    # the archive was saved with (None: none).
    reward_key: str | None = None
    # Which archive and pool the row is of, so `load_rows` refuses to read another one: ids
    # are reassigned by a catalog rebuild, and another pool's catalog gives the same ids
    # to its own archives (None in rows made by hand: not checked).
    manifest_digest: str | None = field(default=None, repr=False, compare=False)
    pool_id: str | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {k: v for k, v in self.__dict__.items() if k not in _INTERNAL}


# `SampleRow`'s fields that locate it for `load_rows`, left out of its JSON view.
_INTERNAL = frozenset({"archive_id", "manifest_digest", "pool_id"})


class SampleRows(list[SampleRow]):
    """What `query_samples` returns: a list of `SampleRow`, which can load its samples."""

    def __init__(self, rows: Iterable[SampleRow], pool: PoolContext) -> None:
        super().__init__(rows)
        self._pool = pool

    def load(self, *, as_arrays: bool = False, materialize: bool = False) -> list[Any]:
        """The samples of these rows, in their order (`load_rows`)."""
        return load_rows(self._pool, self, as_arrays=as_arrays, materialize=materialize)


def _number(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{what} must be a number")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidInputError(f"{what} is too large for a float") from None
    if math.isnan(number):
        raise InvalidInputError(f"{what} must be a number")
    return number


def _may_match(summary: ArchiveSummary | None, wanted: _Wanted) -> bool:
    """Whether an archive's stored summary leaves room for a sample matching ``wanted``
    (False only when it proves none does: no sample of those statuses, rewards or lengths
    all outside the range)."""
    if summary is None:
        return True
    statuses, low_r, high_r, low_l, high_l = wanted
    if statuses is not None:
        counts = dict(summary.status)
        if not any(counts.get(s, 0) for s in statuses):
            return False
    for count, low, high, least, most in (
        (summary.rewarded, low_r, high_r, summary.reward_min, summary.reward_max),
        (summary.measured, low_l, high_l, summary.length_min, summary.length_max),
    ):
        if low is None and high is None:
            continue
        if not count or least is None or most is None:
            return False
        if (low is not None and most < low) or (high is not None and least > high):
            return False
    return True


_Wanted = tuple[list[str] | None, float | None, float | None, float | None, float | None]

# Archives a walk step reads at first, and at most: a dense filter is answered from the first
# archive; a sparse one widens the step so the number of statements stays small.
_FIRST_STEP, _LAST_STEP = 1, 64
# Archives read per listing page: few at first (a dense filter needs one), more later.
_FIRST_PAGE, _LAST_PAGE = 32, 4096


def _walk(
    conn: Connection,
    archive_query: Select[Any],
    sample_query: Select[Any],
    wanted: _Wanted,
    limit: int,
    unnumbered: bool,
    keyed: set[int] | None,
) -> list[Sequence[Any]]:
    """The first ``limit`` rows of ``sample_query`` in archive order, archive by archive.

    NOTE: one statement over every archive lets the planner start from a sample index (a
    status, a reward range) and sort every match across the pool before the LIMIT: 0.33 s at
    a million samples, linear beyond.  Here the archives are read in listing order (the
    ``(state, rollout_id, name)`` index, keyset pages), those whose stored summary proves
    they hold no match are skipped, and the samples of a few archives at a time are read by
    primary key until ``limit`` rows are found (docs/architecture/summaries-and-paging.md,
    "Summaries and paging").
    """
    found: list[Sequence[Any]] = []
    after: ArchiveKey | None = None
    step, page_size = _FIRST_STEP, _FIRST_PAGE
    # NOTE: one archive's samples in position order, named on the table the plan starts from:
    # a status filter reads sample_metadata's (status, archive_id) index, which since the
    # table is WITHOUT ROWID (revision 0006) holds the positions in order, and SQLite sorts
    # when the ORDER BY names the other table's equal column.
    table = sample_metadata_table if wanted[0] is not None else entries_table
    in_order = (table.c.archive_id, table.c.position)
    if keyed is not None:
        if not keyed:
            return found
        if len(keyed) <= IN_BATCH:
            archive_query = archive_query.where(archives_table.c.id.in_(sorted(keyed)))
    while len(found) < limit:
        asked, page_size = page_size, min(page_size * 8, _LAST_PAGE)
        page = archives_in_order(
            conn, archive_query, after=after, limit=asked, unnumbered=unnumbered
        )
        if not page:
            break
        after = (page[-1].rollout_id, page[-1].name)
        stored = read_summaries(conn, [row.id for row in page])
        candidates = [
            row.id
            for row in page
            if (keyed is None or row.id in keyed) and _may_match(stored.get(row.id), wanted)
        ]
        rank = {archive_id: i for i, archive_id in enumerate(candidates)}
        while candidates and len(found) < limit:
            ids, candidates = candidates[:step], candidates[step:]
            step = min(step * 4, _LAST_STEP)
            rows = list(
                conn.execute(
                    sample_query.where(in_order[0] == ids[0])
                    .order_by(*in_order)
                    .limit(limit - len(found))
                    if len(ids) == 1
                    else sample_query.where(entries_table.c.archive_id.in_(ids))
                ).all()
            )
            rows.sort(key=lambda row: (rank[row[0]], row[4]))
            found += rows[: limit - len(found)]
        if len(page) < asked:
            break
    return found


def query_samples(
    pool: PoolContext,
    *,
    task_key: str | None = None,
    sample_key: str | None = None,
    status: str | Enum | Sequence[str | Enum] | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    min_rollout_id: int | None = None,
    max_rollout_id: int | None = None,
    evaluation: bool | None = None,
    state: str | None = "published",
    limit: int | None = None,
    reward_key: str | None = None,
) -> SampleRows:
    """Samples across archives matching every filter given, by rollout, archive, position.

    ``reward_key`` chooses the part of dict rewards read as the reward (in the rows, and for
    ``min_reward``/``max_reward``) instead of the key each archive was saved with, from the
    parts the catalog keeps (`lens.rewards`: no payload is read); archives are then not
    skipped by their stored reward range, which was read with their own key."""
    reward_key = check_reward_key(reward_key)
    a, e, m = archives_table, entries_table, sample_metadata_table
    reward = reward_column(reward_key)
    query = (
        select(
            e.c.archive_id,
            a.c.name,
            a.c.rollout_id,
            a.c.evaluation,
            e.c.position,
            e.c.sample_key,
            e.c.task_key,
            m.c.status,
            reward,
            m.c.response_length,
            m.c.description,
            a.c.reward_key if reward_key is None else literal(reward_key),
            a.c.manifest_digest,
        )
        .select_from(e)
        .join(a, a.c.id == e.c.archive_id)
        .join(m, (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position))
    )
    for value, what in ((task_key, "task_key"), (sample_key, "sample_key")):
        if value is not None and not isinstance(value, str):
            raise InvalidInputError(f"{what} must be a str")
    if sample_key is not None:
        check_key_text(sample_key, "sample_key")
    # A long text (a whole prompt) is found by its digest, as it was saved.
    task_key = check_task_key(task_key)
    if task_key is not None:
        query = query.where(e.c.task_key == task_key)
    if sample_key is not None:
        query = query.where(e.c.sample_key == sample_key)
    if status is not None:
        given = [status] if isinstance(status, (str, Enum)) else list(status)
        # A status enum member (Sample.Status.TRUNCATED) is stored as its value.
        statuses = [v.value if isinstance(v, Enum) else v for v in given]
        for value in statuses:
            if not isinstance(value, str) or len(value) > STATUS_LENGTH or "\x00" in value:
                raise InvalidInputError(
                    f"status {value!r:.80} cannot be queried: the catalog indexes statuses of "
                    f"up to {STATUS_LENGTH} characters (longer ones are kept in each "
                    "sample's metadata only)"
                )
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # the driver's error, raised mid-query
                raise InvalidInputError(f"status {value!r:.80} is not valid unicode text") from None
        query = query.where(m.c.status.in_(statuses))
    archive_query = select(a.c.id, a.c.rollout_id, a.c.name)
    bounds = (
        (reward, min_reward, max_reward, "reward"),
        (m.c.response_length, min_length, max_length, "length"),
        (a.c.rollout_id, min_rollout_id, max_rollout_id, "rollout id"),
    )
    ranges: list[float | None] = []
    for column, low, high, what in bounds:
        if (lo := _number(low, f"minimum {what}")) is not None:
            query = query.where(column >= lo)
            if getattr(column, "table", None) is a:
                archive_query = archive_query.where(column >= lo)
        if (hi := _number(high, f"maximum {what}")) is not None:
            query = query.where(column <= hi)
            if getattr(column, "table", None) is a:
                archive_query = archive_query.where(column <= hi)
        ranges += [lo, hi]
    if evaluation is not None:
        query = query.where(a.c.evaluation == bool(evaluation))
        archive_query = archive_query.where(a.c.evaluation == bool(evaluation))
    if state is not None:
        query = query.where(a.c.state == state)
        archive_query = archive_query.where(a.c.state == state)
    else:
        # Every state of the archives names point at (and pending saves): an archive a name
        # pointed at before it was saved again counts nowhere (docs/architecture/save-protocol.md,
        # "Superseding a name"), unless asked for by its state.
        query = query.where(a.c.state != "superseded")
        archive_query = archive_query.where(a.c.state != "superseded")
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63
    ):
        raise InvalidInputError("limit must be an int >= 0 (and below 2**63)")
    wanted: _Wanted = (
        statuses if status is not None else None,
        # An archive's stored reward range was read with its own key.
        ranges[0] if reward_key is None else None,
        ranges[1] if reward_key is None else None,
        ranges[2],
        ranges[3],
    )
    with pool.catalog.read() as conn:
        if limit is not None:
            numbered = min_rollout_id is not None or max_rollout_id is not None
            # The archives holding the key, from the (task_key | sample_key, archive_id)
            # indexes: a key of one prompt is in a few archives of thousands.
            keyed: set[int] | None = None
            for column, value in ((e.c.task_key, task_key), (e.c.sample_key, sample_key)):
                if value is not None:
                    holders = set(
                        conn.execute(select(e.c.archive_id).where(column == value).distinct())
                        .scalars()
                        .all()
                    )
                    keyed = holders if keyed is None else keyed & holders
            rows = _walk(conn, archive_query, query, wanted, limit, not numbered, keyed)
        else:
            # NULL rollout ids last on both backends, as every listing.
            order = (a.c.rollout_id.is_(None), a.c.rollout_id, a.c.name, e.c.position)
            rows = list(conn.execute(query.order_by(*order)).all())
        pool_id = pool.identity.pool_id if pool.identity is not None else None
        return SampleRows(
            (
                SampleRow(
                    archive=row[1],
                    rollout_id=row[2],
                    evaluation=bool(row[3]),
                    position=row[4],
                    sample_key=row[5],
                    task_key=row[6],
                    status=row[7],
                    reward=row[8],
                    response_length=row[9],
                    metadata=row[10],
                    archive_id=row[0],
                    reward_key=row[11],
                    manifest_digest=row[12],
                    pool_id=pool_id,
                )
                for row in rows
            ),
            pool,
        )


# What locates a row's archive: its name, catalog id and manifest digest, as the query gave.
_RowArchive = tuple[str, int | None, str | None]


def load_rows(
    pool: PoolContext,
    rows: Iterable[SampleRow],
    *,
    as_arrays: bool = False,
    materialize: bool = False,
) -> list[Any]:
    """The samples of ``rows`` (rows of `query_samples`, in any order and from any number of
    archives), in the rows' order: each chunk holding one of them is read once
    (`Archive.load_positions`); a row given twice comes back as the same object twice.

    Every row is checked against the catalog before any blob is read: it must be of this
    pool (a row of another pool's query is refused), and its archive (the one the query
    found: by its catalog id while that id still gives the archive of the row's name and
    manifest, else by its name) must be the archive the row was found in (its manifest), be
    published, or released or superseded with its payload still there, and hold the row's
    sample key at its position.

    Raises:
        InvalidInputError: ``rows`` holds something other than a `SampleRow`, a row of
            another pool, or a row that does not match its archive (a row made by hand, or
            one whose archive's name holds another archive now: saved again after a forget,
            or renumbered by a catalog rebuild and saved again since).
        ArchiveNotFoundError: a row's archive is not in the pool, or is still pending.
        ArchiveReleasedError: a row's archive was released (or superseded) and GC reclaimed
            its payload.
        IntegrityError: a needed blob is missing or damaged.
    """
    if isinstance(rows, (str, bytes, SampleRow)) or not isinstance(rows, Iterable):
        raise InvalidInputError("rows must be an iterable of the SampleRow that query returns")
    wanted = list(rows)
    this_pool = pool.identity.pool_id if pool.identity is not None else None
    for row in wanted:
        if not isinstance(row, SampleRow):
            raise InvalidInputError(
                f"rows must be the SampleRow that query returns, not {type(row).__name__}"
            )
        position = row.position
        # Checked before any query: PostgreSQL refuses to compare an INTEGER column with a
        # number beyond its range instead of finding nothing.
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < 2**31:
            raise InvalidInputError(f"a row's position must be an int >= 0, not {position!r:.40}")
        if row.pool_id is not None and this_pool is not None and row.pool_id != this_pool:
            raise InvalidInputError(
                f"a row of archive {row.archive!r} was found by a query of another pool "
                f"(pool id {row.pool_id}, this pool's is {this_pool}): load rows with the "
                "pool whose query returned them"
            )
    # The rows of each archive, archives in the order the rows first name them.
    by_archive: dict[_RowArchive, list[SampleRow]] = {}
    for row in wanted:
        by_archive.setdefault((row.archive, row.archive_id, row.manifest_digest), []).append(row)
    a, e = archives_table, entries_table
    archives: dict[_RowArchive, Archive] = {}
    superseded: set[_RowArchive] = set()  # rows' archives that their name no longer names
    with pool.catalog.read() as conn:
        for (name, archive_id, digest), its_rows in by_archive.items():
            # By its id while the catalog gives that id to this archive (the archive the
            # query found, whatever the name holds later), else by its name: a catalog
            # rebuilt since the query numbered the archives anew.
            found = None
            if archive_id is not None:
                found = conn.execute(select(a).where(a.c.id == archive_id)).one_or_none()
                if found is not None and (
                    found.name != name or (digest is not None and found.manifest_digest != digest)
                ):
                    found = None
            if found is None:
                named = conn.execute(
                    select(a).where(a.c.name == name, a.c.state != "superseded")
                ).all()
                # The archive the name points at, else its pending save.
                current = [r for r in named if r.state in ("published", "released")]
                found = (current or named)[0] if named else None
                if found is not None and digest is not None and found.manifest_digest != digest:
                    raise InvalidInputError(
                        f"archive {name!r} is not the archive {len(its_rows)} of the rows given "
                        "were found in: the name holds another archive now (saved again since "
                        "the query); query again"
                    )
            # A superseded archive (found by its id only) loads while its payload is there,
            # as a released one does: the rows are of the archive the query found.
            if found is None or found.state not in ("published", "released", "superseded"):
                raise ArchiveNotFoundError(
                    f"archive {name!r} of {len(its_rows)} of the rows given is not in the pool"
                    + ("" if found is None else f" (it is {found.state})")
                )
            archive = Archive(pool, found)
            keys: dict[int, str] = {}
            for batch in batches(sorted({r.position for r in its_rows})):
                keys.update(
                    conn.execute(
                        select(e.c.position, e.c.sample_key).where(
                            e.c.archive_id == found.id, e.c.position.in_(batch)
                        )
                    ).all()
                )
            for row in its_rows:
                if keys.get(row.position) != row.sample_key:
                    raise InvalidInputError(
                        f"archive {found.name!r} holds no sample {row.sample_key!r} at position "
                        f"{row.position} (its sample there is {keys.get(row.position)!r}): the "
                        "row is not one of this archive's; query again"
                    )
            archives[name, archive_id, digest] = archive
            if found.state == "superseded" and payload_gone(conn, found.id):
                raise ArchiveReleasedError(
                    f"archive {name!r} (id {found.id}) of {len(its_rows)} of the rows given "
                    "was superseded (the name was saved again) and garbage collection "
                    "reclaimed its payload; its catalog rows remain for inspection "
                    "('history'); query again for the archive the name holds now"
                )
            if found.state == "superseded":
                superseded.add((name, archive_id, digest))
        gone = reclaimed_names(
            conn, sorted({arc.name for k, arc in archives.items() if k not in superseded})
        )
    for key, its_rows in by_archive.items():
        if key not in superseded and archives[key].name in gone:
            others = len(gone) - 1
            archives[key].raise_reclaimed(
                f"{len(its_rows)} of the rows given are its samples"
                + (f"; {others} other archive(s) of the rows are reclaimed too" if others else "")
            )
    samples: dict[_RowArchive, list[Any]] = {}
    for key, its_rows in by_archive.items():
        samples[key] = archives[key].load_positions(
            [r.position for r in its_rows], as_arrays=as_arrays, materialize=materialize
        )
    # Each archive's samples in its rows' order; taken back in the order of all rows.
    taken = {key: iter(loaded) for key, loaded in samples.items()}
    return [next(taken[row.archive, row.archive_id, row.manifest_digest]) for row in wanted]
