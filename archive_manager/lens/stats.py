"""Training-drift statistics per rollout, from the catalog alone (no payload blob is read).

For every rollout id and evaluation flag: samples, mean / p50 / p90 reward, mean and p90
response length, the share of truncated samples, the share of each status, and bytes.
Each archive's figures were computed once, when its rows were written, and stored in
``archive_summaries`` (`archive_manager.pool.summary`; docs/architecture/summaries-and-paging.md,
"Summaries and paging"): a call reads one small row per archive and merges the rows of each rollout
(exact quantiles for a rollout of one archive; merged sketches, within a stated rank bound, for
several).  The sample-level computation (`summarize_samples`, `build_stats`: pure functions
over sample rows) stays as the reference the stored summaries are tested against.  A
`StatsCache` keeps each rollout's merged summary until the set of its archives changes.

Archives count while their catalog rows describe samples that were generated: published ones
and released ones (a release drops an owner, not the history; the rows stay, so the drift of
a long run stays visible after its old rollouts were released).  Each row says how many of its
archives were released.  Pending saves never count.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, null, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement

from .._util.names import check_archive_name
from ..catalog import (
    archive_summaries_table,
    archives_table,
    entries_table,
    sample_metadata_table,
)
from ..catalog.queries import archive_by_name, batches
from ..errors import ArchiveNotFoundError, IntegrityError, InvalidInputError
from ..pool.context import PoolContext
from ..pool.listing import RolloutRange, check_rollout_range
from ..pool.summary import (
    NO_STATUS,
    ArchiveSummary,
    components_of,
    compute_missing_summaries,
    group_key_of,
    group_spread,
    mean_std,
    merge_summaries,
    nearest_rank,
    read_summaries,
    summarize_archive,
    unscored_flag,
)
from .grouping import CATALOG_FIELDS, check_group_by, payload_groups
from .rewards import check_reward_key, reward_column

__all__ = [
    "COUNTED_STATES",
    "RolloutKey",
    "RolloutRange",
    "RolloutStats",
    "SampleSummary",
    "StatsCache",
    "archive_filters",
    "archive_summary",
    "build_stats",
    "check_rollout_key",
    "check_rollout_range",
    "group_spread",
    "mean_std",
    "nearest_rank",
    "rollout_stats",
    "sample_rows",
    "summarize_samples",
]

COUNTED_STATES = ("published", "released")
"""Archive states whose samples count in the statistics."""

TRUNCATED = "truncated"
"""`Sample.Status.TRUNCATED`'s value: the status of a response cut at the length cap."""


_Group = tuple[int | None, bool]

RolloutKey = tuple[int | None, bool]
"""Where a row of the statistics stands: ``(rollout_id, evaluation)``; the order is by
rollout id, archives without one last, training before evaluation."""


@dataclass(frozen=True)
class RolloutStats:
    """The statistics of one rollout id and evaluation flag (`ArchiveManager.stats`).

    ``reward_*`` cover the samples with a numeric reward (``rewarded`` of them; a dict of
    named rewards is not a number), ``length_*`` those with a response length.  ``status``
    holds ``(status, samples)`` pairs, most frequent first.
    """

    rollout_id: int | None
    evaluation: bool
    archives: int
    released: int
    samples: int
    bytes: int
    rewarded: int
    reward_mean: float | None
    reward_p50: float | None
    reward_p90: float | None
    length_mean: float | None
    length_p90: float | None
    status: tuple[tuple[str, int], ...]
    # Prompt groups (the samples of one archive that share a task key, else a group_index)
    # with at least two numeric rewards; of those, how many had every reward equal (they
    # teach GRPO nothing), and the mean of their reward standard deviations (n - 1).
    groups: int = 0
    zero_variance_groups: int = 0
    group_std_mean: float | None = None
    # Samples whose reward is not a number and gave none (a dict of named rewards and no key
    # chosen, or a key its dict lacks), the keys those dicts hold (at most 32), and the
    # reward keys the row's rewards were read with (the one given, else those its archives
    # were saved with; empty: none).
    unscored: int = 0
    reward_components: tuple[str, ...] = ()
    reward_keys: tuple[str, ...] = ()

    @property
    def reward_note(self) -> str | None:
        """What to do about the samples whose reward gave no number (None when there are
        none): how many, and the keys to choose from."""
        if not self.unscored:
            return None
        keys = ", ".join(self.reward_components)
        return (
            f"{self.unscored} sample(s) have a reward that is not a number"
            + (f" (a dict of {keys})" if keys else "")
            + (
                f" and no part named {', '.join(map(repr, self.reward_keys))}"
                if self.reward_keys
                else ""
            )
            + ": choose the part that is the reward with reward_key= (the CLI's --reward-key)"
            + (" at save or now" if not self.reward_keys else "")
        )

    @property
    def zero_variance_share(self) -> float | None:
        """Share of the prompt groups whose rewards are all equal (None for no group)."""
        return self.zero_variance_groups / self.groups if self.groups else None

    @property
    def truncated_share(self) -> float | None:
        """Share of the samples whose status is ``truncated`` (None for no sample)."""
        return self.status_share(TRUNCATED)

    def status_share(self, status: str) -> float | None:
        """Share of the samples with ``status`` (None for no sample)."""
        if not self.samples:
            return None
        return dict(self.status).get(status, 0) / self.samples

    @property
    def status_shares(self) -> dict[str, float]:
        """Share of the samples by status, most frequent first."""
        return {s: n / self.samples for s, n in self.status} if self.samples else {}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (shares included).  A mean that overflowed a float (rewards
        near 1e308 add up to infinity) is None: strict JSON has no infinity."""
        return {
            "rollout_id": self.rollout_id,
            "evaluation": self.evaluation,
            "archives": self.archives,
            "released": self.released,
            "samples": self.samples,
            "bytes": self.bytes,
            "rewarded": self.rewarded,
            "reward_mean": self.reward_mean,
            "reward_p50": self.reward_p50,
            "reward_p90": self.reward_p90,
            "length_mean": self.length_mean,
            "length_p90": self.length_p90,
            "truncated_share": self.truncated_share,
            "status": dict(self.status),
            "status_shares": self.status_shares,
            "groups": self.groups,
            "zero_variance_groups": self.zero_variance_groups,
            "zero_variance_share": self.zero_variance_share,
            "group_std_mean": self.group_std_mean,
            "unscored": self.unscored,
            "reward_components": list(self.reward_components),
            "reward_keys": list(self.reward_keys),
            "reward_note": self.reward_note,
        }


def check_rollout_key(key: object) -> RolloutKey:
    """Check a row's key of the statistics (the ``after`` of a page): ``(rollout_id,
    evaluation)``, the id a 64-bit int or None, the flag a bool.

    Raises:
        InvalidInputError: anything else.
    """
    if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], bool)):
        raise InvalidInputError(
            "a rollout key must be (rollout_id, evaluation): an int or None, a bool"
        )
    rollout_id = key[0]
    if rollout_id is not None and (
        isinstance(rollout_id, bool)
        or not isinstance(rollout_id, int)
        or not -(2**63) <= rollout_id < 2**63
    ):
        raise InvalidInputError("a rollout key's rollout id must be a 64-bit int or None")
    return (rollout_id, key[1])


def narrow_rollout_bounds(
    rollout_ids: object, low: int | None, high: int | None
) -> tuple[int | None, int | None]:
    """``min_rollout_id``/``max_rollout_id`` narrowed by a ``rollout_ids`` filter (as
    `check_rollout_range` takes it): the sample queries' one rollout-id filter, whether it
    came as ``rollout_ids`` or as both ends.

    Raises:
        InvalidInputError: as `check_rollout_range`.
    """
    bounds = check_rollout_range(rollout_ids)
    if bounds is None:
        return low, high
    first, last = bounds
    if first is not None:
        low = first if low is None else max(first, low)
    if last is not None:
        high = last if high is None else min(last, high)
    return low, high


@dataclass(frozen=True)
class SampleSummary:
    """What the samples of one group of archives add up to (cached: archives are immutable)."""

    status: tuple[tuple[str, int], ...]
    rewarded: int
    reward_mean: float | None
    reward_p50: float | None
    reward_p90: float | None
    length_mean: float | None
    length_p90: float | None
    groups: int = 0
    zero_variance_groups: int = 0
    group_std_mean: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    length_p50: float | None = None
    length_min: float | None = None
    length_max: float | None = None
    unscored: int = 0
    reward_components: tuple[str, ...] = ()

    @property
    def samples(self) -> int:
        """Samples counted (every status)."""
        return sum(n for _, n in self.status)

    def overview(self) -> dict[str, Any]:
        """Samples, status counts, and mean / p50 / p90 / min / max of the response length
        and the reward (None where no sample has one): what ``archive-manager show`` prints,
        from the figures the web viewer's archive page shows, so the two cannot disagree."""

        def figures(mean: float | None, *others: float | None) -> dict[str, float | None] | None:
            if mean is None:
                return None
            return dict(zip(("mean", "p50", "p90", "min", "max"), (mean, *others), strict=True))

        return {
            "samples": self.samples,
            "response_length": figures(
                self.length_mean, self.length_p50, self.length_p90, self.length_min, self.length_max
            ),
            "reward": figures(
                self.reward_mean, self.reward_p50, self.reward_p90, self.reward_min, self.reward_max
            ),
            "status": dict(self.status),
        }


def summarize_samples(
    status_rows: Iterable[Sequence[Any]],
    value_rows: Iterable[Sequence[Any]],
    group_rows: Iterable[Sequence[Any]] = (),
) -> SampleSummary:
    """Add up the sample rows of one group; pure, no I/O.

    Args:
        status_rows: ``(status, samples, rewarded, reward_sum, measured, length_sum)`` per
            status (several rows of one status add up); ``rewarded`` counts the samples with
            a reward, ``measured`` those with a response length.
        value_rows: ``(reward, response_length)`` per sample (either may be None), for the
            quantiles.
        group_rows: ``(archive_id, group, reward)`` per sample with a group (a task key,
            else a ``group_index``: `group_key_of`) and a reward, for the prompt-group
            figures (`group_spread`).
    """
    counts: dict[str, int] = defaultdict(int)
    rewarded = measured = 0
    reward_sum = length_sum = 0.0
    for status, samples, n_rewards, rewards, n_lengths, lengths in status_rows:
        counts[NO_STATUS if status is None else str(status)] += int(samples)
        rewarded += int(n_rewards or 0)
        reward_sum += float(rewards or 0.0)
        measured += int(n_lengths or 0)
        length_sum += float(lengths or 0.0)
    reward_values: list[float] = []
    length_values: list[float] = []
    for reward, length in value_rows:
        if reward is not None:
            reward_values.append(float(reward))
        if length is not None:
            length_values.append(float(length))
    reward_values.sort()
    length_values.sort()
    groups, flat, std_mean = group_spread(group_rows)
    return SampleSummary(
        groups=groups,
        zero_variance_groups=flat,
        group_std_mean=std_mean,
        status=tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0]))),
        rewarded=rewarded,
        reward_mean=_mean(reward_sum, rewarded, reward_values),
        reward_p50=nearest_rank(reward_values, 0.5),
        reward_p90=nearest_rank(reward_values, 0.9),
        length_mean=_mean(length_sum, measured, length_values),
        length_p90=nearest_rank(length_values, 0.9),
        reward_min=reward_values[0] if reward_values else None,
        reward_max=reward_values[-1] if reward_values else None,
        length_p50=nearest_rank(length_values, 0.5),
        length_min=length_values[0] if length_values else None,
        length_max=length_values[-1] if length_values else None,
    )


def _mean(total: float, count: int, values: list[float]) -> float | None:
    """``total / count``; when the SQL sum overflowed (rewards near 1e308), the mean is taken
    term by term from the values instead, which stays finite whenever the mean is."""
    if not count:
        return None
    if math.isfinite(total):
        return total / count
    mean = math.fsum(v / len(values) for v in values) if values else math.nan
    return mean if math.isfinite(mean) else None


def _group_key(rollout_id: int | None, evaluation: Any) -> _Group:
    return (rollout_id, bool(evaluation))


def _order(key: _Group) -> tuple[bool, int, bool]:
    # By rollout id, archives without one last; training before evaluation.
    return (key[0] is None, key[0] or 0, key[1])


def _combine(
    key: _Group,
    archives: Sequence[Sequence[Any]],
    summary: SampleSummary,
    reward_key: str | None = None,
) -> RolloutStats:
    return RolloutStats(
        rollout_id=key[0],
        evaluation=key[1],
        archives=len(archives),
        released=sum(1 for row in archives if row[4] == "released"),
        samples=summary.samples,
        bytes=sum(int(row[5] or 0) for row in archives),
        rewarded=summary.rewarded,
        reward_mean=summary.reward_mean,
        reward_p50=summary.reward_p50,
        reward_p90=summary.reward_p90,
        length_mean=summary.length_mean,
        length_p90=summary.length_p90,
        status=summary.status,
        groups=summary.groups,
        zero_variance_groups=summary.zero_variance_groups,
        group_std_mean=summary.group_std_mean,
        unscored=summary.unscored,
        reward_components=summary.reward_components,
        reward_keys=_keys_used(archives, reward_key),
    )


def _keys_used(archives: Sequence[Sequence[Any]], reward_key: str | None) -> tuple[str, ...]:
    """The reward keys a row's rewards were read with: the one given, else those its
    archives were saved with (their rows of ``rollout_stats``'s statement end with it)."""
    if reward_key is not None:
        return (reward_key,)
    return tuple(sorted({row[_KEY_AT] for row in archives if len(row) > _KEY_AT} - {None}))


def _by_group(archive_rows: Iterable[Sequence[Any]]) -> dict[_Group, list[Sequence[Any]]]:
    groups: dict[_Group, list[Sequence[Any]]] = defaultdict(list)
    for row in archive_rows:
        groups[_group_key(row[2], row[3])].append(row)
    return groups


def build_stats(
    archive_rows: Iterable[Sequence[Any]],
    status_rows: Iterable[Sequence[Any]],
    value_rows: Iterable[Sequence[Any]],
    group_rows: Iterable[Sequence[Any]] = (),
) -> list[RolloutStats]:
    """Assemble `RolloutStats` from catalog rows; pure, no I/O.

    Args:
        archive_rows: ``(id, manifest_digest, rollout_id, evaluation, state, bytes)`` per
            archive that counts.
        status_rows: ``(archive_id, status, samples, rewarded, reward_sum, measured,
            length_sum)`` per archive and status (see `summarize_samples`).
        value_rows: ``(archive_id, reward, response_length)`` per sample.
        group_rows: ``(archive_id, group, reward)`` per sample with a group (`group_key_of`)
            and a reward.

    Returns:
        One row per rollout id and evaluation flag, by rollout id (None last), training
        before evaluation.  Rows of archives not in ``archive_rows`` are ignored.
    """
    groups = _by_group(archive_rows)
    group_of = {row[0]: key for key, rows in groups.items() for row in rows}
    statuses: dict[_Group, list[Sequence[Any]]] = defaultdict(list)
    values: dict[_Group, list[Sequence[Any]]] = defaultdict(list)
    for row in status_rows:
        if row[0] in group_of:
            statuses[group_of[row[0]]].append(row[1:])
    for row in value_rows:
        if row[0] in group_of:
            values[group_of[row[0]]].append(row[1:])
    spreads: dict[_Group, list[Sequence[Any]]] = defaultdict(list)
    for row in group_rows:
        if row[0] in group_of:
            spreads[group_of[row[0]]].append(row)
    return [
        _combine(key, groups[key], summarize_samples(statuses[key], values[key], spreads[key]))
        for key in sorted(groups, key=_order)
    ]


class StatsCache:
    """`SampleSummary` per rollout group, valid while the group holds the same archives.

    NOTE: sound because an archive's sample rows never change once it is visible (archives
    are immutable; ids are never reused) and the key also holds each archive's manifest
    digest, which names its content even across a catalog rebuild.  States and bytes are
    not cached: they are read afresh on every call.
    """

    def __init__(self) -> None:
        self._entries: dict[_Group, tuple[frozenset[tuple[int, str | None]], SampleSummary]] = {}
        self._lock = threading.Lock()

    def get(self, key: _Group, members: frozenset[tuple[int, str | None]]) -> SampleSummary | None:
        """The cached summary of group ``key`` if it still holds exactly ``members``."""
        with self._lock:
            entry = self._entries.get(key)
        return entry[1] if entry is not None and entry[0] == members else None

    def put(
        self, key: _Group, members: frozenset[tuple[int, str | None]], summary: SampleSummary
    ) -> None:
        """Remember ``summary`` for group ``key`` made of ``members``."""
        with self._lock:
            self._entries[key] = (members, summary)

    def __len__(self) -> int:
        return len(self._entries)


def archive_filters(
    rollout_ids: RolloutRange | None,
    evaluation: bool | None,
    states: Sequence[str] = COUNTED_STATES,
) -> list[ColumnElement[bool]]:
    """WHERE clauses on ``archives``: state in ``states``, rollout id in the (inclusive)
    bounds, the evaluation flag."""
    a = archives_table
    where: list[ColumnElement[bool]] = [a.c.state.in_(list(states))]
    if rollout_ids is not None:
        low, high = rollout_ids
        if low is not None:
            where.append(a.c.rollout_id >= low)
        if high is not None:
            where.append(a.c.rollout_id <= high)
    if evaluation is not None:
        where.append(a.c.evaluation == evaluation)
    return where


def sample_rows(
    conn: Connection, archive_ids: Sequence[int]
) -> tuple[list[Sequence[Any]], list[Sequence[Any]], list[Sequence[Any]]]:
    """The status rows, value rows and group rows (see `build_stats`) of these archives: the
    sample-level computation the stored summaries are tested against."""
    m, e = sample_metadata_table, entries_table
    status_rows: list[Sequence[Any]] = []
    value_rows: list[Sequence[Any]] = []
    group_rows: list[Sequence[Any]] = []
    for batch in batches(archive_ids):
        status_rows += conn.execute(
            select(
                m.c.archive_id,
                m.c.status,
                func.count(),
                func.count(m.c.reward),
                func.sum(m.c.reward),
                func.count(m.c.response_length),
                func.sum(m.c.response_length),
            )
            .where(m.c.archive_id.in_(batch))
            .group_by(m.c.archive_id, m.c.status)
        ).all()
        value_rows += conn.execute(
            select(m.c.archive_id, m.c.reward, m.c.response_length).where(m.c.archive_id.in_(batch))
        ).all()
        for archive_id, task_key, description, reward in conn.execute(
            select(e.c.archive_id, e.c.task_key, m.c.description, m.c.reward)
            .join(m, (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position))
            .where(e.c.archive_id.in_(batch), m.c.reward.is_not(None))
        ):
            group = group_key_of(task_key, description)
            if group is not None:
                group_rows.append((archive_id, group, reward))
    return status_rows, value_rows, group_rows


def _sample_summary(s: ArchiveSummary) -> SampleSummary:
    return SampleSummary(
        status=s.status,
        rewarded=s.rewarded,
        reward_mean=s.reward_mean,
        reward_p50=s.reward_p50,
        reward_p90=s.reward_p90,
        length_mean=s.length_mean,
        length_p90=s.length_p90,
        groups=s.groups,
        zero_variance_groups=s.zero_variance_groups,
        group_std_mean=s.group_std_mean,
        reward_min=s.reward_min,
        reward_max=s.reward_max,
        length_p50=s.length_p50,
        length_min=s.length_min,
        length_max=s.length_max,
        unscored=s.unscored,
        reward_components=s.reward_components,
    )


def _summaries(
    conn: Connection, archive_ids: Sequence[int], *, sketches: bool
) -> dict[int, ArchiveSummary]:
    """The stored summaries of these archives; one an upgrade emitted as SQL text left
    without is computed from its sample rows (not stored: this may be a reader)."""
    found = read_summaries(conn, archive_ids, sketches=sketches)
    lacking = [i for i in archive_ids if i not in found]
    if lacking:
        found.update(compute_missing_summaries(conn, lacking))
    return found


def archive_summary(pool: PoolContext, name: str) -> SampleSummary:
    """The `SampleSummary` of one published or released archive (its stored summary).

    Raises:
        ArchiveNotFoundError: no such visible archive.
    """
    check_archive_name(name)
    with pool.catalog.read() as conn:
        row = archive_by_name(conn, name)
        if row is None or row.state not in COUNTED_STATES:
            raise ArchiveNotFoundError(f"archive {name!r} not found")
        summary = _summaries(conn, [row.id], sketches=False)[row.id]
    return _sample_summary(summary)


def rollout_stats(
    pool: PoolContext,
    rollout_ids: object = None,
    evaluation: bool | None = None,
    *,
    cache: StatsCache | None = None,
    after: object = None,
    limit: int | None = None,
    keys: Collection[RolloutKey] | None = None,
    group_by: str | None = None,
    reward_key: str | None = None,
) -> list[RolloutStats]:
    """The statistics of every rollout id and evaluation flag of ``pool`` (catalog only).

    Reads one stored summary per archive (docs/architecture/summaries-and-paging.md, "Summaries and
    paging"); the sketches only of rollouts that hold several archives, whose quantiles are merged
    (`archive_manager.pool.summary.merge_quantile`).

    Args:
        pool: The pool.
        rollout_ids: None (all), an int, a ``range`` or an inclusive ``(low, high)`` whose
            ends may be None; archives without a rollout id count only when this is None.
        evaluation: None (both), True (evaluation rollouts) or False (training rollouts).
        cache: Summaries of groups seen before, reused while a group's archives are the same.
        after: A `RolloutKey`: only the rows after it (keyset paging).
        limit: At most this many rows, the first in order.
        keys: Only the rows of these keys (the rollouts of one page of archives).
        group_by: The one field the prompt groups are taken from (`lens.grouping`) instead
            of the lens's rule (task key, else ``group_index``), which the stored summaries
            hold: the rows are then computed from every sample's catalog row, exactly
            (quantiles too), and a field the catalog does not hold is decoded from each
            archive's chunks, that field alone.  Not cached.
        reward_key: The part of dict rewards to read as the reward (`lens.rewards`) instead
            of the key each archive was saved with: the rows of archives saved with another
            are computed from every sample's catalog row (``sample_rewards`` holds every
            numeric part: no payload is read), exactly, not cached; when every archive asked
            about was saved with this key, the stored summaries answer.

    Raises:
        InvalidInputError: a malformed filter, key, limit or ``group_by``.
        ArchiveReleasedError: ``group_by`` a payload field of an archive GC reclaimed.
    """
    group_by = check_group_by(group_by)
    reward_key = check_reward_key(reward_key)
    bounds = check_rollout_range(rollout_ids)
    if evaluation is not None and not isinstance(evaluation, bool):
        raise InvalidInputError("evaluation must be a bool or None")
    start = None if after is None else check_rollout_key(after)
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63
    ):
        raise InvalidInputError("limit must be an int >= 0 (and below 2**63)")
    a, t = archives_table, archive_summaries_table
    where = archive_filters(bounds, evaluation)
    # NOTE: the summaries come joined to the archive rows, in one statement: IN lists of
    # thousands of ids cost more to bind than the rows to read.  Only the figures a rollout
    # of one archive shows (`_one_archive`): the archives of a rollout of several have their
    # whole summaries and sketches read apart, to merge them.
    archive_query = (
        select(
            a.c.id,
            a.c.manifest_digest,
            a.c.rollout_id,
            a.c.evaluation,
            a.c.state,
            a.c.bytes,
            *(t.c[name] for name in _SHOWN),
            a.c.reward_key,
        )
        .select_from(a.outerjoin(t, t.c.archive_id == a.c.id))
        .where(*where)
    )
    with pool.catalog.read() as conn:
        chosen = None if keys is None else {_group_key(*check_rollout_key(k)) for k in keys}
        if start is not None or limit is not None:
            page = set(_keys_after(conn, where, start, limit))
            chosen = page if chosen is None else chosen & page
        if chosen is not None:
            # A page reads the archives of its rollout-id span only
            # (docs/architecture/summaries-and-paging.md, "Summaries and paging"); rows of the span
            # not asked for are dropped below.
            numbered = [k[0] for k in chosen if k[0] is not None]
            span = []
            if numbered:
                span.append(a.c.rollout_id.between(min(numbered), max(numbered)))
            if len(numbered) < len(chosen):
                span.append(a.c.rollout_id.is_(None))
            if not span:
                return []
            archive_query = archive_query.where(or_(*span))
        rows = conn.execute(archive_query).all()
        groups = _by_group(rows)
        if chosen is not None:
            groups = defaultdict(list, {k: g for k, g in groups.items() if k in chosen})
        # Rows the stored summaries cannot answer are computed from the samples' rows
        # (`_from_samples`, once the read is over: a payload field is read from the store).
        resample = group_by is not None or (
            reward_key is not None
            and any(r[_KEY_AT] != reward_key for g in groups.values() for r in g)
        )
        facts: _Facts = {}
        components: dict[int, list[str]] = {}
        if resample:
            ids = [r[0] for g in groups.values() for r in g]
            facts = _sample_facts(conn, ids, group_by, reward_key)
            components = components_of(conn, ids)
        done: dict[_Group, RolloutStats] = {}
        merged: dict[_Group, list[Sequence[Any]]] = {}
        for key, group in () if resample else groups.items():
            # NOTE: a rollout of one archive, the common case, is its stored row as it is:
            # nothing to merge or cache (docs/architecture/summaries-and-paging.md, "Summaries and
            # paging").
            if len(group) == 1 and group[0][_AT["archive_id"]] is not None:
                done[key] = _one_archive(key, group[0])
            else:
                merged[key] = group
        members = {key: frozenset((r[0], r[1]) for r in rows) for key, rows in merged.items()}
        summaries: dict[_Group, SampleSummary] = {}
        missing: list[_Group] = []
        for key in merged:
            cached = cache.get(key, members[key]) if cache is not None else None
            if cached is None:
                missing.append(key)
            else:
                summaries[key] = cached
        # A rollout of one archive without a stored summary (an upgrade emitted as SQL
        # text) has it computed; a rollout of several has its archives' summaries and
        # sketches read (those missing computed).
        stored: dict[int, ArchiveSummary] = {}
        lacking = [g[0][0] for key in missing if len(g := groups[key]) == 1]
        if lacking:
            stored.update(compute_missing_summaries(conn, lacking))
        several = [r[0] for key in missing if len(groups[key]) > 1 for r in groups[key]]
        stored.update(_summaries(conn, several, sketches=True))
    if resample:
        return _from_samples(pool, groups, facts, components, group_by, reward_key)
    for key in missing:
        summaries[key] = _sample_summary(merge_summaries([stored[r[0]] for r in groups[key]]))
        if cache is not None:
            cache.put(key, members[key], summaries[key])
    for key, summary in summaries.items():
        done[key] = _combine(key, groups[key], summary, reward_key)
    return [done[key] for key in sorted(groups, key=_order)]


# What `_from_samples` needs of one archive: its name, and per sample in position order
# ``[status, reward, response_length, group, unscored]`` (``group`` None until a payload
# field is read).
_Facts = dict[int, tuple[str, list[list[Any]]]]


def _sample_facts(
    conn: Connection, archive_ids: Sequence[int], group_by: str | None, reward_key: str | None
) -> _Facts:
    """Every sample's catalog row of these archives, for `_from_samples`, its reward as
    ``reward_key`` chooses it (`reward_column`); the description (for ``group_index``) is
    read only where the grouping needs it."""
    a, e, m = archives_table, entries_table, sample_metadata_table
    # NOTE: ``group_index`` is read out of the description in SQL: parsing every sample's
    # description in Python was a third of the time (docs/lens.md, "Rewards").
    index: Any = m.c.description["group_index"].as_string()
    if group_by is None:
        index = case((e.c.task_key.is_(None), index), else_=null())
    elif group_by != "group_index":
        index = null()
    columns = [
        e.c.archive_id,
        m.c.status,
        reward_column(reward_key),
        m.c.response_length,
        e.c.task_key,
        index,
        unscored_flag(),
    ]
    facts: _Facts = {}
    names: dict[int, str] = {}
    for batch in batches(archive_ids):
        names.update(conn.execute(select(a.c.id, a.c.name).where(a.c.id.in_(batch))).all())
    for batch in batches(archive_ids):
        query = (
            select(*columns)
            .select_from(e)
            .join(m, (m.c.archive_id == e.c.archive_id) & (m.c.position == e.c.position))
            .where(e.c.archive_id.in_(batch))
            .order_by(e.c.archive_id, e.c.position)
        )
        rows: list[list[Any]] = []
        current = None
        # NOTE: fetched many rows at a time: iterating the result fetched one row per call,
        # half of the time the rows took.
        for archive_id, status, reward, length, task_key, found, flag in (
            row for part in conn.execute(query).partitions(_FETCH) for row in part
        ):
            if archive_id != current:
                current, rows = archive_id, facts.setdefault(archive_id, (names[archive_id], []))[1]
            if group_by is None:
                group = task_key if task_key is not None else _json_int(found)
            elif group_by == "task_key":
                group = task_key
            elif group_by == "group_index":
                group = _json_int(found)
            else:
                group = None  # read from the payload by `_from_samples`
            rows.append([status, reward, length, group, flag])
    for archive_id in archive_ids:
        facts.setdefault(archive_id, ("", []))
    return facts


_FETCH = 4096  # sample rows `_sample_facts` fetches at a time


def _json_int(value: Any) -> int | None:
    """A ``group_index`` as SQL reads it out of a description (an int, or its text on
    PostgreSQL), else None: what `pool.summary.group_index_of` makes of it."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _from_samples(
    pool: PoolContext,
    groups: dict[_Group, list[Sequence[Any]]],
    facts: _Facts,
    components: dict[int, list[str]],
    group_by: str | None,
    reward_key: str | None,
) -> list[RolloutStats]:
    """The rows of ``groups`` computed from their samples' rows (`_sample_facts`): one
    `summarize_archive` over each rollout's samples, a prompt group being one archive's
    samples of one group (``group_by``, else the lens's rule)."""
    if group_by is not None and group_by not in CATALOG_FIELDS:
        for name, rows in facts.values():
            if not rows:
                continue
            keys = payload_groups(pool, name, group_by)
            if len(keys) != len(rows):
                raise IntegrityError(
                    f"archive {name!r}: {len(keys)} samples in its chunks, {len(rows)} in the "
                    "catalog"
                )
            for row, key in zip(rows, keys, strict=True):
                row[3] = key
    out = []
    for key in sorted(groups, key=_order):
        members = groups[key]
        summary = summarize_archive(
            (
                (status, reward, length, None if group is None else (archive[0], group), flag)
                for archive in members
                for status, reward, length, group, flag in facts[archive[0]][1]
            ),
            (k for archive in members for k in components.get(archive[0], ())),
        )
        out.append(_combine(key, members, _sample_summary(summary), reward_key))
    return out


def _keys_after(
    conn: Connection,
    where: Sequence[ColumnElement[bool]],
    after: RolloutKey | None,
    limit: int | None,
) -> list[_Group]:
    """The keys of the first ``limit`` rows of the statistics after ``after``, in order.

    NOTE: two statements, the rollouts with an id then those without, each ordered by plain
    columns, as `catalog.queries.archives_in_order` reads the listings.
    """
    a = archives_table
    keys: list[_Group] = []
    if after is None or after[0] is not None:
        part = select(a.c.rollout_id, a.c.evaluation).where(*where, a.c.rollout_id.is_not(None))
        if after is not None:
            later = a.c.rollout_id > after[0]
            if not after[1]:  # its evaluation row comes after the training row
                later = or_(later, and_(a.c.rollout_id == after[0], a.c.evaluation.is_(True)))
            part = part.where(later)
        part = part.distinct().order_by(a.c.rollout_id, a.c.evaluation)
        found = conn.execute(part if limit is None else part.limit(limit)).all()
        keys += [_group_key(rollout_id, flag) for rollout_id, flag in found]
    if (limit is None or len(keys) < limit) and after != (None, True):
        part = select(a.c.evaluation).where(*where, a.c.rollout_id.is_(None))
        if after == (None, False):
            part = part.where(a.c.evaluation.is_(True))
        flags = conn.execute(part.distinct().order_by(a.c.evaluation)).scalars().all()
        keys += [_group_key(None, flag) for flag in flags]
    return keys if limit is None else keys[:limit]


# The summary columns of ``rollout_stats``'s statement, after the six archive columns: what
# `_one_archive` shows, ``archive_id`` first (None: the archive has no stored summary).
_SHOWN = (
    "archive_id",
    "status",
    "rewarded",
    "reward_mean",
    "reward_p50",
    "reward_p90",
    "length_mean",
    "length_p90",
    "groups",
    "zero_variance_groups",
    "group_std_mean",
    "unscored",
    "reward_components",
)
_AT = {name: 6 + i for i, name in enumerate(_SHOWN)}
_KEY_AT = 6 + len(_SHOWN)  # the archive's reward key, last


def _one_archive(key: _Group, row: Sequence[Any]) -> RolloutStats:
    """The statistics of a rollout of one archive, straight from its row of
    ``rollout_stats``'s statement (the archive's columns, then `_SHOWN`): what ``_combine``
    makes of the stored summary, without the summaries in between."""
    # NOTE: positional, on a plain tuple: this runs once per rollout, 10,000 times for the
    # pool page's charts.
    (_, _, _, _, state, size, _, status, rewarded, r_mean, r_p50, r_p90, l_mean, l_p90,
     groups, flat, std_mean, unscored, components, saved_key) = tuple(row)  # fmt: skip
    counts = sorted([(str(k), int(n)) for k, n in (status or {}).items()], key=_most_first)
    return RolloutStats(
        rollout_id=key[0],
        evaluation=key[1],
        archives=1,
        released=int(state == "released"),
        samples=sum(n for _, n in counts),
        bytes=int(size or 0),
        rewarded=rewarded,
        reward_mean=r_mean,
        reward_p50=r_p50,
        reward_p90=r_p90,
        length_mean=l_mean,
        length_p90=l_p90,
        status=tuple(counts),
        groups=groups,
        zero_variance_groups=flat,
        group_std_mean=std_mean,
        unscored=int(unscored or 0),
        reward_components=tuple(components) if isinstance(components, list) else (),
        reward_keys=() if saved_key is None else (saved_key,),
    )


def _most_first(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])
