"""The viewer's catalog reads: one page of archives with their owners, one page of an
archive's samples filtered and sorted in SQL.  Read transactions only; no blob is read."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.sql import ColumnElement

from .._util.names import check_archive_name
from ..catalog import (
    archives_table,
    chunks_table,
    entries_table,
    retention_table,
    sample_metadata_table,
)
from ..catalog.queries import archive_by_name, archives_in_order
from ..errors import ArchiveNotFoundError
from ..lens.rewards import reward_column
from ..lens.stats import COUNTED_STATES, RolloutRange, archive_filters
from ..pool.archive import ArchiveInfo

if TYPE_CHECKING:
    from ..manager import ArchiveManager

__all__ = [
    "SAMPLE_SORTS",
    "ArchivePage",
    "SampleFilter",
    "SamplePage",
    "archive_page",
    "entry_of",
    "sample_page",
    "task_positions",
]

#: Columns the samples of an archive can be sorted by (the position breaks ties).
SAMPLE_SORTS = ("position", "reward", "response_length", "status", "sample_key", "task_key")


@dataclass(frozen=True)
class ArchivePage:
    """One page of the pool's archives (by rollout id, then name) and their owners."""

    total: int
    archives: list[ArchiveInfo]
    owners: dict[str, list[str]]
    chunks: dict[str, int]


def archive_page(
    pool: ArchiveManager,
    *,
    states: Sequence[str] = COUNTED_STATES,
    rollout_ids: RolloutRange | None = None,
    evaluation: bool | None = None,
    offset: int = 0,
    limit: int = 100,
    after: str | None = None,
) -> ArchivePage:
    """Archives in ``states`` matching the filters, one page of them, with owners.

    ``after`` (an archive's name) starts the page after that archive by keyset, as cheap
    deep in the listing as on its first page; otherwise the page starts at ``offset``.
    """
    a, r, c = archives_table, retention_table, chunks_table
    where = archive_filters(rollout_ids, evaluation, states)
    with pool.catalog.read() as conn:
        total = int(conn.execute(select(func.count()).select_from(a).where(*where)).scalar_one())
        start = archive_by_name(conn, after) if after is not None else None
        if start is not None:
            rows: Sequence[Any] = archives_in_order(
                conn, select(a).where(*where), after=(start.rollout_id, start.name), limit=limit
            )
        elif after is not None:
            raise ArchiveNotFoundError(f"archive {after!r} (the page's start) not found")
        else:
            rows = conn.execute(
                select(a)
                .where(*where)
                # NULL rollout ids last on both backends (SQLite sorts them first by default).
                .order_by(a.c.rollout_id.is_(None), a.c.rollout_id, a.c.name)
                .offset(offset)
                .limit(limit)
            ).all()
        ids = {row.id: row.name for row in rows}
        owners: dict[str, list[str]] = defaultdict(list)
        chunks: dict[str, int] = {}
        if ids:
            for archive_id, owner in conn.execute(
                select(r.c.archive_id, r.c.owner)
                .where(r.c.archive_id.in_(list(ids)))
                .order_by(r.c.owner)
            ):
                owners[ids[archive_id]].append(owner)
            for archive_id, count in conn.execute(
                select(c.c.archive_id, func.count())
                .where(c.c.archive_id.in_(list(ids)))
                .group_by(c.c.archive_id)
            ):
                chunks[ids[archive_id]] = int(count)
    return ArchivePage(total, [ArchiveInfo.from_row(row) for row in rows], dict(owners), chunks)


@dataclass(frozen=True)
class SampleFilter:
    """What the archive page's form asks for; every field optional."""

    statuses: tuple[str, ...] = ()
    task_key: str | None = None
    sample_key: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    sort: str = "position"
    descending: bool = False
    # The key of dict rewards read as the reward (None: the one the archive was saved with).
    reward_key: str | None = None

    def active(self) -> bool:
        """Whether any filter (not the sort) is set."""
        return any(
            v not in (None, ())
            for v in (
                self.statuses,
                self.task_key,
                self.sample_key,
                self.min_reward,
                self.max_reward,
                self.min_length,
                self.max_length,
            )
        )


@dataclass(frozen=True)
class SamplePage:
    """One page of an archive's samples: the matching count and the rows."""

    total: int
    rows: list[dict[str, Any]]


def _visible(conn: Any, name: str) -> Any:
    check_archive_name(name)
    row = archive_by_name(conn, name)
    if row is None or row.state not in COUNTED_STATES:
        raise ArchiveNotFoundError(f"archive {name!r} not found")
    return row


def sample_page(
    pool: ArchiveManager,
    name: str,
    where: SampleFilter,
    *,
    offset: int = 0,
    limit: int = 100,
) -> SamplePage:
    """The samples of archive ``name`` that pass ``where``, sorted, one page of them.

    Raises:
        ArchiveNotFoundError: no such published or released archive.
    """
    e, m = entries_table, sample_metadata_table
    reward = reward_column(where.reward_key).label("reward")
    columns = {
        "position": e.c.position,
        "reward": reward,
        "response_length": m.c.response_length,
        "status": m.c.status,
        "sample_key": e.c.sample_key,
        "task_key": e.c.task_key,
    }
    sort = columns[where.sort]
    with pool.catalog.read() as conn:
        archive_id = _visible(conn, name).id
        conditions: list[ColumnElement[bool]] = [e.c.archive_id == archive_id]
        if where.statuses:
            conditions.append(m.c.status.in_(list(where.statuses)))
        if where.task_key is not None:
            conditions.append(e.c.task_key == where.task_key)
        if where.sample_key is not None:
            conditions.append(e.c.sample_key == where.sample_key)
        for column, low, high in (
            (reward, where.min_reward, where.max_reward),
            (m.c.response_length, where.min_length, where.max_length),
        ):
            if low is not None:
                conditions.append(column >= low)
            if high is not None:
                conditions.append(column <= high)
        joined = e.join(m, (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position))
        total = int(
            conn.execute(select(func.count()).select_from(joined).where(*conditions)).scalar_one()
        )
        # Missing values sort last both ways, and the same on SQLite and PostgreSQL.
        order = [sort.is_(None), sort.desc() if where.descending else sort.asc(), e.c.position]
        rows = conn.execute(
            select(
                e.c.position,
                e.c.sample_key,
                e.c.task_key,
                m.c.status,
                reward,
                m.c.response_length,
            )
            .select_from(joined)
            .where(*conditions)
            .order_by(*order)
            .offset(offset)
            .limit(limit)
        ).all()
    return SamplePage(total, [dict(row._mapping) for row in rows])


def entry_of(pool: ArchiveManager, name: str, position: int) -> dict[str, Any] | None:
    """The catalog's entry of one sample: keys and `describe_sample` metadata, or None.

    Raises:
        ArchiveNotFoundError: no such published or released archive.
    """
    e, m = entries_table, sample_metadata_table
    with pool.catalog.read() as conn:
        archive_id = _visible(conn, name).id
        row = conn.execute(
            select(e.c.sample_key, e.c.task_key, m.c.description)
            .select_from(e)
            .outerjoin(m, (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position))
            .where(e.c.archive_id == archive_id, e.c.position == position)
        ).one_or_none()
    if row is None:
        return None
    from ..metadata import as_described  # numpy and the codec: not at the viewer's start

    entry = dict(row._mapping)
    if entry["description"] is not None:
        entry["description"] = as_described(entry["description"])
    return entry


def task_positions(
    pool: ArchiveManager, task_key: str, names: Sequence[str]
) -> dict[str, list[int]]:
    """Per archive of ``names``, the positions of its samples of task key ``task_key``."""
    a, e = archives_table, entries_table
    out: dict[str, list[int]] = defaultdict(list)
    if not names:
        return {}
    with pool.catalog.read() as conn:
        for name, position in conn.execute(
            select(a.c.name, e.c.position)
            .join(e, e.c.archive_id == a.c.id)
            .where(
                a.c.name.in_(list(names)),
                a.c.state.in_(list(COUNTED_STATES)),
                e.c.task_key == task_key,
            )
            .order_by(a.c.name, e.c.position)
        ):
            out[name].append(position)
    return dict(out)
