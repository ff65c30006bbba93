"""Click parameter types for durations (``2h``), points in time (``3d`` ago or a date) and
rollout id ranges (``3..7``): bad values are usage errors (exit 2), caught before any work."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._util.humanize import looks_like_duration, parse_duration
from ..errors import InvalidInputError

if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]
else:
    # NOTE: click is generic from 8.4 on; 8.1 to 8.3 (which the project supports) cannot
    # subscript it at runtime.
    _ParamType = click.ParamType

__all__ = ["DURATION", "ROLLOUT_RANGE", "SINCE", "check_subset", "parse_duration"]


class Duration(_ParamType):
    """A duration option: ``--grace 1h``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Parse to a `timedelta`."""
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Since(_ParamType):
    """A point in time: a duration ago (``2h``, ``3d``) or a date/time (local unless it
    carries an offset), as an aware datetime."""

    name = "when"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Parse to an aware `datetime`."""
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        if looks_like_duration(text):
            try:
                return datetime.now(timezone.utc) - parse_duration(text)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            except OverflowError:
                self.fail(f"{text!r} ago is before the year 1", param, ctx)
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is neither a duration (2h, 3d) nor a date/time (2024-05-01, "
                "'2024-05-01 13:00')",
                param,
                ctx,
            )
        try:
            # A naive time is the user's local time, as every time the CLI prints.
            return when.astimezone()
        except (OverflowError, ValueError, OSError):
            # Year 1 or 9999 moved out of datetime's range by the time zone's offset.
            self.fail(f"{text!r} is out of range once in local time", param, ctx)


class RolloutRange(_ParamType):
    """A rollout id (``5``) or an inclusive range (``3..7``, ``3..``, ``..7``)."""

    name = "id|A..B"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Parse to ``(low, high)``, either of which may be None."""
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        low_text, sep, high_text = text.partition("..")
        try:
            low = int(low_text) if low_text else None
            high = int(high_text) if high_text else None
        except ValueError:
            self.fail(f"{text!r} is not a rollout id or a range A..B", param, ctx)
        if not sep:
            if low is None:
                self.fail("give a rollout id or a range A..B", param, ctx)
            return (low, low)
        if low is None and high is None:
            self.fail("a range needs at least one end (A..B, A.. or ..B)", param, ctx)
        if low is not None and high is not None and low > high:
            self.fail(f"range {text!r} is empty: {low} > {high}", param, ctx)
        return (low, high)


def check_subset(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Validate ``--subset`` with the library's own parser, as a usage error."""
    if value is not None:
        from ..pool.verify import parse_subset

        try:
            parse_subset(value)
        except InvalidInputError as exc:
            raise click.BadParameter(str(exc), ctx, param) from exc
    return value


DURATION = Duration()
SINCE = Since()
ROLLOUT_RANGE = RolloutRange()


class PoolRoot(_ParamType):
    """``--root``: a folder (a `Path`), or ``s3://bucket/prefix`` kept as it is (a pool on an
    object store, docs/architecture/object-stores.md, "Blobs on an object store"); a Path would fold
    its ``//``."""

    name = "root"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("s3://"):
            return value
        return click.Path(file_okay=False, path_type=Path).convert(value, param, ctx)
