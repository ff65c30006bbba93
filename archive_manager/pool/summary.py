"""Per-archive summaries: what the statistics need of one archive's samples, computed once when
its rows are written and kept in ``archive_summaries`` (docs/architecture/summaries-and-paging.md,
"Summaries").

An archive never changes once written, so its sample count, status counts, reward and
response-length figures and prompt-group figures are facts: `ArchiveManager.stats` over N
archives reads N small rows instead of every sample.  Quantiles stay exact for a group of
archives that holds one archive (the stored p50 / p90 are that archive's own).  For several
archives the stored *sketches* are merged (`merge_quantile`): each holds at most
`SKETCH_POINTS` of the archive's sorted values, so the merged quantile is a value that occurs,
exact when every archive holds at most `SKETCH_POINTS` values, and otherwise off by fewer than
``sum(ceil(n_i / SKETCH_POINTS))`` ranks (a bound `quantile_rank_error` computes).

Pure functions compute and combine; `summary_rows` / `store_summary` / `read_summaries` are
the catalog side.  Everything here is shared by the save (``writer.insert_contents``), the
catalog rebuild (which goes through the same function), the migration that gives existing
pools theirs (``migrations/versions/0005_archive_summaries.py``) and the statistics.
"""

from __future__ import annotations

import math
import struct
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, case, exists, null, select, type_coerce
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from ..catalog import (
    archive_sketches_table,
    archive_summaries_table,
    archives_table,
    entries_table,
    sample_metadata_table,
    sample_rewards_table,
)
from ..catalog.bulk import insert_rows
from ..catalog.queries import batches

__all__ = [
    "MAX_COMPONENTS",
    "NO_STATUS",
    "SKETCH_POINTS",
    "ArchiveSummary",
    "components_of",
    "compute_missing_summaries",
    "drop_untasked_summaries",
    "fill_missing_summaries",
    "group_index_of",
    "group_key_of",
    "group_spread",
    "mean_std",
    "merge_quantile",
    "merge_summaries",
    "nearest_rank",
    "quantile_rank_error",
    "read_summaries",
    "sample_rows_of",
    "sketch_of",
    "sketch_weights",
    "store_summaries",
    "summarize_archive",
    "summary_columns",
    "summary_from_row",
    "summary_rows",
    "unscored_flag",
]

SKETCH_POINTS = 128
"""Values an archive's quantile sketch keeps of each column (reward, response length): 1 KiB
each, about 2 bytes a sample at 1,024 samples an archive."""

NO_STATUS = "none"
"""The status key of samples whose status the catalog does not index (absent or too long)."""


def nearest_rank(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values by the nearest-rank method (a value that occurs).

    The smallest value with at least ``q * n`` values at or below it (the one definition of a
    quantile in this library).  None for no values.
    """
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (``n - 1``, as ``torch.std``) of finite floats;
    each value is divided before summing, so values near the float limit do not overflow."""
    if not values:
        return None, None
    n = len(values)
    mean = math.fsum(v / n for v in values)
    if n < 2:
        return mean, None
    try:
        var = math.fsum(((v - mean) / n) * (v - mean) for v in values) * (n / (n - 1))
    except OverflowError:
        return mean, None
    return mean, math.sqrt(var) if math.isfinite(var) else None


def group_index_of(description: Any) -> int | None:
    """The ``group_index`` `describe_sample` recorded in a sample's description: an int
    within 64 bits, or None."""
    if not isinstance(description, dict):
        return None
    index = description.get("group_index")
    return index if type(index) is int else None


def group_key_of(task_key: str | None, description: Any) -> str | int | None:
    """The prompt group of one sample by the lens's rule (docs/architecture/rl-lens.md, "The RL
    lens"): its task key; without one, the ``group_index`` its description holds (slime
    marks a prompt's completions so and saves no task key); else None, ungrouped.  A key (a
    str) and an index (an int) never collide as dict keys."""
    return task_key if task_key is not None else group_index_of(description)


def _group_stds(rewards: Iterable[Sequence[Any]]) -> tuple[int, int, list[float]]:
    by_group: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for archive_id, group, reward in rewards:
        if reward is not None and math.isfinite(float(reward)):
            by_group[(archive_id, group)].append(float(reward))
    stds: list[float] = []
    groups = flat = 0
    for values in by_group.values():
        if len(values) < 2:
            continue
        groups += 1
        flat += min(values) == max(values)
        std = mean_std(values)[1]
        if std is not None:
            stds.append(std)
    return groups, flat, stds


def group_spread(rewards: Iterable[Sequence[Any]]) -> tuple[int, int, float | None]:
    """``(groups, zero_variance_groups, mean of their stds)`` over ``(archive_id, group,
    reward)`` rows (``group`` a task key, a ``group_index``: `group_key_of`): groups with at
    least two finite rewards count."""
    groups, flat, stds = _group_stds(rewards)
    return groups, flat, mean_std(stds)[0]


def sketch_weights(count: int, points: int) -> list[int]:
    """How many of ``count`` sorted values each of a sketch's ``points`` stands for: the
    values ranked after the previous point's rank up to its own (`sketch_of`)."""
    if points >= count:
        return [1] * count
    ranks = [math.ceil(k * count / points) for k in range(points + 1)]
    return [ranks[k] - ranks[k - 1] for k in range(1, points + 1)]


def sketch_of(ordered: Sequence[float]) -> list[float]:
    """The quantile sketch of sorted values: all of them up to `SKETCH_POINTS`, else the
    values at ranks ``ceil(k * n / SKETCH_POINTS)`` for k = 1..SKETCH_POINTS (the last is the
    maximum)."""
    n = len(ordered)
    if n <= SKETCH_POINTS:
        return list(ordered)
    return [ordered[math.ceil(k * n / SKETCH_POINTS) - 1] for k in range(1, SKETCH_POINTS + 1)]


def merge_quantile(sketches: Sequence[tuple[Sequence[float], int]], q: float) -> float | None:
    """The ``q`` quantile, by nearest rank, of the values several sketches stand for.

    Each sketch is ``(points, count)``; every point counts for the values it stands for
    (`sketch_weights`).  Exact when every sketch holds all its values; otherwise the value
    returned occurs in some archive and its rank is off by less than `quantile_rank_error`.
    """
    weighted: list[tuple[float, int]] = []
    for points, count in sketches:
        weighted += zip(points, sketch_weights(count, len(points)), strict=True)
    total = sum(w for _, w in weighted)
    if not total:
        return None
    weighted.sort(key=lambda pair: pair[0])
    target = min(total, max(1, math.ceil(q * total)))
    seen = 0
    for value, weight in weighted:
        seen += weight
        if seen >= target:
            return value
    return weighted[-1][0]


def quantile_rank_error(counts: Iterable[int]) -> int:
    """The bound `merge_quantile` keeps to: ranks by which its answer may miss the exact
    nearest-rank quantile of archives holding ``counts`` values."""
    return sum(math.ceil(n / SKETCH_POINTS) for n in counts)


def _pack(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def _unpack(data: bytes | None) -> list[float]:
    if not data:
        return []
    return list(struct.unpack(f"<{len(data) // 8}d", data))


@dataclass(frozen=True)
class ArchiveSummary:
    """What the statistics need of one archive's samples (or of several, merged).

    ``status`` holds ``(status, samples)`` pairs, most frequent first.  ``rewarded`` samples
    have a numeric reward, ``measured`` a response length.  ``groups`` are the prompt groups
    (one archive's samples sharing a task key, or without one a ``group_index``:
    `group_key_of`) with two or more rewards; ``group_stds`` of
    them had a finite standard deviation, whose mean is ``group_std_mean``.  The sketches are
    `sketch_of` the sorted rewards and lengths (empty when not read).  ``unscored`` samples
    have a reward that is not a number and gave none (a dict of named rewards without a
    chosen key: `describe_sample`), and ``reward_components`` are the keys such dicts hold
    (sorted, at most `MAX_COMPONENTS`): what to tell whoever sees no reward.
    """

    samples: int
    status: tuple[tuple[str, int], ...]
    rewarded: int
    reward_mean: float | None
    reward_min: float | None
    reward_max: float | None
    reward_p50: float | None
    reward_p90: float | None
    measured: int
    length_mean: float | None
    length_min: float | None
    length_max: float | None
    length_p50: float | None
    length_p90: float | None
    groups: int
    zero_variance_groups: int
    group_stds: int
    group_std_mean: float | None
    reward_sketch: tuple[float, ...] = ()
    length_sketch: tuple[float, ...] = ()
    unscored: int = 0
    reward_components: tuple[str, ...] = ()


def _sorted_status(counts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _mean_of(values: Sequence[float]) -> float | None:
    if not values:
        return None
    try:
        total = math.fsum(values)
    except OverflowError:
        total = math.inf
    if math.isfinite(total):
        return total / len(values)
    # Rewards near the float limit add up to infinity: divide each first.
    mean = math.fsum(v / len(values) for v in values)
    return mean if math.isfinite(mean) else None


def summarize_archive(
    rows: Iterable[Sequence[Any]], components: Iterable[str] = ()
) -> ArchiveSummary:
    """Summarize one archive from its samples' ``(status, reward, response_length, group,
    unscored)`` as the catalog indexes them (`sample_metadata` columns; ``group`` is
    `group_key_of` its task key and description, or any hashable a caller groups by, None for
    no group; ``unscored`` true for a reward that is not a number and gave none, and may be
    left out) and the keys its dict rewards hold; pure, no I/O."""
    counts: dict[str, int] = defaultdict(int)
    rewards: list[float] = []
    lengths: list[float] = []
    grouped: list[tuple[int, Any, float]] = []
    samples = unscored = 0
    for row in rows:
        status, reward, length, group = row[:4]
        samples += 1
        if len(row) > 4 and row[4] and reward is None:
            unscored += 1
        counts[NO_STATUS if status is None else str(status)] += 1
        if reward is not None:
            rewards.append(float(reward))
            if group is not None:
                grouped.append((0, group, float(reward)))
        if length is not None:
            lengths.append(float(length))
    rewards.sort()
    lengths.sort()
    groups, flat, stds = _group_stds(grouped)
    return ArchiveSummary(
        samples=samples,
        status=_sorted_status(counts),
        rewarded=len(rewards),
        reward_mean=_mean_of(rewards),
        reward_min=rewards[0] if rewards else None,
        reward_max=rewards[-1] if rewards else None,
        reward_p50=nearest_rank(rewards, 0.5),
        reward_p90=nearest_rank(rewards, 0.9),
        measured=len(lengths),
        length_mean=_mean_of(lengths),
        length_min=lengths[0] if lengths else None,
        length_max=lengths[-1] if lengths else None,
        length_p50=nearest_rank(lengths, 0.5),
        length_p90=nearest_rank(lengths, 0.9),
        groups=groups,
        zero_variance_groups=flat,
        group_stds=len(stds),
        group_std_mean=mean_std(stds)[0],
        reward_sketch=tuple(sketch_of(rewards)),
        length_sketch=tuple(sketch_of(lengths)),
        unscored=unscored,
        reward_components=_components(components),
    )


MAX_COMPONENTS = 32
"""Keys of dict rewards a summary keeps, to say which can be chosen (`reward_components`)."""


def _components(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(keys)))[:MAX_COMPONENTS]


def _weighted_mean(parts: Sequence[tuple[float | None, int]]) -> float | None:
    # Each mean is scaled by its share before summing: no overflow where the means are finite.
    total = sum(n for mean, n in parts if mean is not None)
    if not total:
        return None
    mean = math.fsum(m * (n / total) for m, n in parts if m is not None)
    return mean if math.isfinite(mean) else None


def _extreme(values: Iterable[float | None], pick: Any) -> float | None:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def merge_summaries(parts: Sequence[ArchiveSummary]) -> ArchiveSummary:
    """Combine the summaries of several archives into one (counts add up; means are weighted
    by their counts; minima and maxima are taken; quantiles are the stored ones for a single
    archive, else `merge_quantile` over the sketches, which must have been read)."""
    if len(parts) == 1:
        return parts[0]
    counts: dict[str, int] = defaultdict(int)
    for part in parts:
        for status, n in part.status:
            counts[status] += n
    rewards = [(p.reward_sketch, p.rewarded) for p in parts if p.rewarded]
    lengths = [(p.length_sketch, p.measured) for p in parts if p.measured]
    for sketch, _ in (*rewards, *lengths):
        if not sketch:
            raise ValueError("merging several archives' quantiles needs their sketches")
    return ArchiveSummary(
        samples=sum(p.samples for p in parts),
        status=_sorted_status(counts),
        rewarded=sum(p.rewarded for p in parts),
        reward_mean=_weighted_mean([(p.reward_mean, p.rewarded) for p in parts]),
        reward_min=_extreme((p.reward_min for p in parts), min),
        reward_max=_extreme((p.reward_max for p in parts), max),
        reward_p50=merge_quantile(rewards, 0.5),
        reward_p90=merge_quantile(rewards, 0.9),
        measured=sum(p.measured for p in parts),
        length_mean=_weighted_mean([(p.length_mean, p.measured) for p in parts]),
        length_min=_extreme((p.length_min for p in parts), min),
        length_max=_extreme((p.length_max for p in parts), max),
        length_p50=merge_quantile(lengths, 0.5),
        length_p90=merge_quantile(lengths, 0.9),
        groups=sum(p.groups for p in parts),
        zero_variance_groups=sum(p.zero_variance_groups for p in parts),
        group_stds=sum(p.group_stds for p in parts),
        group_std_mean=_weighted_mean([(p.group_std_mean, p.group_stds) for p in parts]),
        unscored=sum(p.unscored for p in parts),
        reward_components=_components(k for p in parts for k in p.reward_components),
    )


_COLUMNS = (
    "archive_id",
    "samples",
    "status",
    "rewarded",
    "reward_mean",
    "reward_min",
    "reward_max",
    "reward_p50",
    "reward_p90",
    "measured",
    "length_mean",
    "length_min",
    "length_max",
    "length_p50",
    "length_p90",
    "groups",
    "zero_variance_groups",
    "group_stds",
    "group_std_mean",
    "unscored",
    "reward_components",
)


def summary_rows(
    archive_id: int, summary: ArchiveSummary
) -> tuple[Any, ...]:  # in `_COLUMNS` order
    """The ``archive_summaries`` row of ``summary``."""
    s = summary
    return (
        archive_id,
        s.samples,
        dict(s.status),
        s.rewarded,
        s.reward_mean,
        s.reward_min,
        s.reward_max,
        s.reward_p50,
        s.reward_p90,
        s.measured,
        s.length_mean,
        s.length_min,
        s.length_max,
        s.length_p50,
        s.length_p90,
        s.groups,
        s.zero_variance_groups,
        s.group_stds,
        s.group_std_mean,
        s.unscored,
        list(s.reward_components) or None,
    )


def store_summaries(conn: Connection, summaries: Iterable[tuple[int, ArchiveSummary]]) -> int:
    """Inside a write transaction: insert the summary rows of ``(archive_id, summary)`` and
    their sketches (``archive_sketches``)."""
    given = list(summaries)
    insert_rows(
        conn,
        archive_sketches_table,
        ("archive_id", "reward_sketch", "length_sketch"),
        (
            (archive_id, _pack(summary.reward_sketch), _pack(summary.length_sketch))
            for archive_id, summary in given
        ),
        batch_size=1_000,
    )
    return insert_rows(
        conn,
        archive_summaries_table,
        _COLUMNS,
        (summary_rows(archive_id, summary) for archive_id, summary in given),
        batch_size=1_000,
    )


def read_summaries(
    conn: Connection, archive_ids: Sequence[int], *, sketches: bool = False
) -> dict[int, ArchiveSummary]:
    """The stored summaries of these archives (those that have one); with their sketches only
    when asked (a stats row of one archive needs none)."""
    t, k = archive_summaries_table, archive_sketches_table
    found: dict[int, ArchiveSummary] = {}
    for batch in batches(archive_ids):
        query = select(*summary_columns())
        if sketches:
            query = query.add_columns(k.c.reward_sketch, k.c.length_sketch).outerjoin(
                k, k.c.archive_id == t.c.archive_id
            )
        for row in conn.execute(query.where(t.c.archive_id.in_(batch))):
            found[row[0]] = summary_from_row(row)
    return found


def summary_columns() -> list[Any]:
    """The ``archive_summaries`` columns `summary_from_row` reads, ``archive_id`` first (to
    join to another select: a missing summary reads as a None ``archive_id``); the sketches,
    when wanted, follow them (``archive_sketches``)."""
    t = archive_summaries_table
    return [t.c[name] for name in _COLUMNS]


def summary_from_row(row: Sequence[Any]) -> ArchiveSummary:
    """The summary in a row of `summary_columns`."""
    return _from_row(row)


def _from_row(row: Sequence[Any]) -> ArchiveSummary:
    # Positional, in `_COLUMNS` order: this runs once per archive of a `stats` call.
    status = row[2] or {}
    figures: list[Any] = [
        row[1],
        _sorted_status({str(k): int(n) for k, n in status.items()}),
        *row[3:19],
    ]
    sketches = row[len(_COLUMNS) :]
    # The positional fields are typed Any here; the dataclass checks their number.
    make: Any = ArchiveSummary
    return make(  # type: ignore[no-any-return]
        *figures,
        reward_sketch=tuple(_unpack(sketches[0])) if sketches else (),
        length_sketch=tuple(_unpack(sketches[1])) if sketches else (),
        unscored=int(row[19] or 0),
        reward_components=_stored_components(row[20]),
    )


def _stored_components(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(k for k in value if isinstance(k, str))


def unscored_flag() -> ColumnElement[bool]:
    """Whether a ``sample_metadata`` row's sample has a reward that is not a number (a row of
    component "" in ``sample_rewards``, `writer.insert_contents`)."""
    m, r = sample_metadata_table, sample_rewards_table
    return exists().where(
        r.c.archive_id == m.c.archive_id, r.c.position == m.c.position, r.c.component == ""
    )


def components_of(conn: Connection, archive_ids: Sequence[int]) -> dict[int, list[str]]:
    """The keys of the dict rewards each archive's samples hold (`sample_rewards`)."""
    r = sample_rewards_table
    found: dict[int, list[str]] = defaultdict(list)
    for batch in batches(archive_ids):
        for archive_id, component in conn.execute(
            select(r.c.archive_id, r.c.component)
            .where(r.c.archive_id.in_(batch), r.c.component != "")
            .distinct()
        ):
            found[archive_id].append(component)
    return found


def sample_rows_of(conn: Connection, archive_ids: Sequence[int]) -> dict[int, list[Sequence[Any]]]:
    """Each archive's ``(status, reward, response_length, group, unscored)`` per sample
    (``group`` by `group_key_of`), read from the catalog: what `summarize_archive` takes.

    NOTE: the description (where ``group_index`` is) is read only of samples without a task
    key: a pool of task keys reads no JSON."""
    m, e = sample_metadata_table, entries_table
    rows: dict[int, list[Sequence[Any]]] = {archive_id: [] for archive_id in archive_ids}
    untasked = type_coerce(case((e.c.task_key.is_(None), m.c.description), else_=null()), JSON)
    flag = unscored_flag()
    for batch in batches(archive_ids):
        query = (
            select(
                m.c.archive_id,
                m.c.status,
                m.c.reward,
                m.c.response_length,
                e.c.task_key,
                untasked,
                flag,
            )
            .select_from(m)
            .join(
                e,
                (e.c.archive_id == m.c.archive_id) & (e.c.position == m.c.position),
                isouter=True,
            )
            .where(m.c.archive_id.in_(batch))
        )
        for archive_id, status, reward, length, task_key, description, unscored in conn.execute(
            query
        ):
            rows[archive_id].append(
                (status, reward, length, group_key_of(task_key, description), unscored)
            )
    return rows


def compute_missing_summaries(
    conn: Connection, archive_ids: Sequence[int]
) -> dict[int, ArchiveSummary]:
    """Summaries of archives that have none stored, computed from their sample rows (not
    stored: a reader cannot write)."""
    components = components_of(conn, archive_ids)
    return {
        archive_id: summarize_archive(rows, components.get(archive_id, ()))
        for archive_id, rows in sample_rows_of(conn, archive_ids).items()
    }


def fill_missing_summaries(conn: Connection, *, batch: int = 256) -> int:
    """Inside a write transaction: compute and store the summary of every archive that has
    none (a catalog upgraded from before summaries); return how many."""
    a, t = archives_table, archive_summaries_table
    missing = (
        conn.execute(
            select(a.c.id)
            .select_from(a.outerjoin(t, t.c.archive_id == a.c.id))
            .where(t.c.archive_id.is_(None))
            .order_by(a.c.id)
        )
        .scalars()
        .all()
    )
    for ids in batches(missing, batch):
        store_summaries(conn, compute_missing_summaries(conn, ids).items())
    return len(missing)


def drop_untasked_summaries(conn: Connection) -> int:
    """Inside a write transaction: delete the summaries (and sketches) of the archives that
    hold a sample without a task key, whose prompt groups were counted before samples were
    grouped by ``group_index`` (`group_key_of`); `fill_missing_summaries` computes them
    again.  Returns how many."""
    e, t, k = entries_table, archive_summaries_table, archive_sketches_table
    stale = (
        conn.execute(
            select(t.c.archive_id).where(
                t.c.archive_id.in_(select(e.c.archive_id).where(e.c.task_key.is_(None)))
            )
        )
        .scalars()
        .all()
    )
    for ids in batches(stale):
        conn.execute(k.delete().where(k.c.archive_id.in_(ids)))
        conn.execute(t.delete().where(t.c.archive_id.in_(ids)))
    return len(stale)
