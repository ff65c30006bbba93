"""What `ArchiveManager.find` lists, in one place below the catalog: `ArchiveInfo` (one
archive as listings show it) and the listing's filters checked and normalised
(`listing_filter`), which the catalog's query (`ArchiveManager.find`) and the SQLite listing
read with the standard library (`pool/sqlite_listing.py`) both take, so the two cannot disagree on
what a filter means or which input is refused (docs/architecture/start-up.md, "Start-up").

No SQLAlchemy here: ``archive-manager ls`` imports this module without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .._util.names import check_archive_name
from ..errors import InvalidInputError
from ..samples import check_task_key

__all__ = [
    "ARCHIVE_STATES",
    "ArchiveInfo",
    "ListingFilter",
    "RolloutRange",
    "check_rollout_id",
    "check_rollout_range",
    "listing_filter",
    "rollout_filter",
    "utc_time",
]

ARCHIVE_STATES = ("pending", "published", "released", "superseded")
"""The states an archive row takes (``state=None`` in a listing: any of them).  A
``superseded`` archive is one its name pointed at before the name was saved again
(``supersede=True``): listed for audit, counted nowhere."""

RolloutRange = tuple[int | None, int | None]
"""An inclusive range of rollout ids; either end may be None (open)."""


def utc_time(ts: float | None) -> datetime | None:
    """A catalog timestamp (seconds since the epoch) as an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


@dataclass(frozen=True)
class ArchiveInfo:
    """One row of `ArchiveManager.find`: what the catalog knows of an archive."""

    name: str
    rollout_id: int | None
    evaluation: bool
    state: str
    samples: int
    bytes: int
    created_at: datetime
    published_at: datetime | None
    released_at: datetime | None = None
    reference: str | None = None
    id: int | None = None
    """The catalog's id of the archive: a name saved again (``supersede=True``) names several
    archives over time, each with its own id (`ArchiveManager.history`)."""
    superseded_at: datetime | None = None
    """When the name was saved again (state ``superseded``)."""
    superseded_by: int | None = None
    """The id of the archive that took the name (state ``superseded``)."""

    @classmethod
    def from_row(cls, row: Any) -> ArchiveInfo:
        """Build from an ``archives`` row (any object with its columns as attributes)."""
        return cls(
            name=row.name,
            rollout_id=row.rollout_id,
            evaluation=bool(row.evaluation),
            state=row.state,
            samples=row.samples,
            bytes=row.bytes,
            created_at=utc_time(row.created_at),  # type: ignore[arg-type]
            published_at=utc_time(row.published_at),
            released_at=utc_time(row.released_at),
            reference=row.reference_name,
            id=row.id,
            superseded_at=utc_time(row.superseded_at),
            superseded_by=row.superseded_by,
        )


def check_rollout_range(rollout_ids: object, param: str = "rollout_ids") -> RolloutRange | None:
    """Normalize a rollout-id filter: None, an int, a ``range`` (step 1) or ``(low, high)``.

    The one parser of the filter every method takes (find, query, stats, the exports, the
    datasets, forget, search, the prompt lens); ``param`` is the name the caller gave it,
    which the messages name.

    Raises:
        InvalidInputError: anything else, a range with another step, low > high, or an end
            outside the 64-bit rollout ids the catalog holds.
    """
    bounds = _check_rollout_range(rollout_ids, param)
    for end in bounds or ():
        if end is not None and not -(2**63) <= end < 2**63:
            raise InvalidInputError(
                f"{param}: rollout id {end} does not fit in 64 bits (rollout ids are signed 64-bit ints)"
            )
    return bounds


def _check_rollout_range(rollout_ids: object, param: str) -> RolloutRange | None:
    if rollout_ids is None:
        return None
    if isinstance(rollout_ids, bool):
        raise InvalidInputError(f"{param} must be an int, a range or (low, high), not a bool")
    if isinstance(rollout_ids, int):
        return (rollout_ids, rollout_ids)
    if isinstance(rollout_ids, range):
        if rollout_ids.step != 1:
            raise InvalidInputError(f"{param}: a range of rollout ids must have step 1")
        if not rollout_ids:
            raise InvalidInputError(f"{param}: {rollout_ids!r} holds no rollout id")
        return (rollout_ids.start, rollout_ids.stop - 1)
    if isinstance(rollout_ids, tuple) and len(rollout_ids) == 2:
        low, high = rollout_ids
        for end in (low, high):
            if end is not None and (isinstance(end, bool) or not isinstance(end, int)):
                raise InvalidInputError(f"the ends of {param} (low, high) must be ints or None")
        if low is not None and high is not None and low > high:
            raise InvalidInputError(f"{param}: rollout id range {low}..{high} is empty")
        return (low, high)
    # The CLI's A..B is text only there: the API takes the range as a tuple.
    spelled = " ('A..B' is (A, B) here)" if isinstance(rollout_ids, str) else ""
    raise InvalidInputError(
        f"{param} must be None, an int, a range or (low, high), "
        f"not {type(rollout_ids).__name__}{spelled}"
    )


def rollout_filter(rollout_ids: object, rollout_id: object = None) -> RolloutRange | None:
    """The rollout-id filter of a call that takes both spellings: ``rollout_ids``, or
    ``rollout_id``, `find`'s older name for the same filter, checked as
    `check_rollout_range` checks it, its messages naming the spelling the caller used.

    Raises:
        InvalidInputError: both given, or as `check_rollout_range`.
    """
    if rollout_id is None:
        return check_rollout_range(rollout_ids)
    if rollout_ids is not None:
        raise InvalidInputError("give rollout_ids or its older spelling rollout_id, not both")
    return check_rollout_range(rollout_id, "rollout_id")


def check_rollout_id(rollout_id: object) -> int | None:
    """Rollout ids are ints that fit the catalog's 64-bit column (or None)."""
    if rollout_id is None:
        return None
    if not isinstance(rollout_id, int) or isinstance(rollout_id, bool):
        raise InvalidInputError(
            f"rollout_id must be an int or None, not {type(rollout_id).__name__}"
        )
    if not -(2**63) <= rollout_id < 2**63:
        raise InvalidInputError("rollout_id does not fit in 64 bits")
    return rollout_id


@dataclass(frozen=True)
class ListingFilter:
    """The filters of one listing, checked: what `ArchiveManager.find` selects, by rollout
    id (archives without one last) then name."""

    rollout_low: int | None = None
    """Lowest rollout id (inclusive; None: no lower bound).  Either bound leaves out the
    archives without a rollout id."""
    rollout_high: int | None = None
    """Highest rollout id (inclusive; None: no upper bound)."""
    evaluation: bool | None = None
    task_key: str | None = None
    created_since: float | None = None
    """Seconds since the epoch: archives created at or after it."""
    state: str | None = "published"
    limit: int | None = None
    after: str | None = None
    """An archive's name as given: the listing starts after that archive."""


def listing_filter(
    rollout_id: int | range | tuple[int | None, int | None] | None = None,
    evaluation: bool | None = None,
    task_key: str | None = None,
    state: str | None = "published",
    since: datetime | None = None,
    *,
    rollout_ids: int | range | tuple[int | None, int | None] | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> ListingFilter:
    """`ArchiveManager.find`'s arguments checked (in its order, with its messages).

    Raises:
        InvalidInputError: a filter of the wrong type or out of range.
    """
    low, high = rollout_filter(rollout_ids, rollout_id) or (None, None)
    if evaluation is not None and not isinstance(evaluation, bool):
        raise InvalidInputError("evaluation must be a bool or None")
    key = check_task_key(task_key) if task_key is not None else None
    cutoff: float | None = None
    if since is not None:
        if not isinstance(since, datetime):
            raise InvalidInputError("since must be a datetime")
        try:
            cutoff = since.timestamp()
        except (OverflowError, ValueError, OSError):
            # A naive datetime.min or max is local time, which may fall outside the
            # range datetime can hold once moved to UTC.
            raise InvalidInputError(f"since {since} is out of range") from None
    if state is not None and state not in ARCHIVE_STATES:
        raise InvalidInputError(f"state must be one of {', '.join(ARCHIVE_STATES)} or None")
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit < 2**63
    ):
        raise InvalidInputError("limit must be an int >= 0 (and below 2**63)")
    if after is not None:
        if not isinstance(after, str):
            raise InvalidInputError("after must be an archive name (str) or None")
        check_archive_name(after)
    return ListingFilter(low, high, evaluation, key, cutoff, state, limit, after)
