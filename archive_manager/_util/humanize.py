"""Numbers and times for people (sizes in binary units, short durations, local times), shared
by the CLI and the web viewer; the viewer must not import the CLI (docs/architecture/index.md,
"Layers")."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

__all__ = [
    "duration_seconds",
    "human_duration",
    "human_size",
    "local_time",
    "looks_like_duration",
    "parse_duration",
]

_MAX_SECONDS = timedelta.max.total_seconds()
_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(n: int | float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    """A short duration for people: ``850 us``, ``12 ms``, ``1.25 s``, ``3 min 5 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s"


def local_time(when: datetime | None) -> str:
    """An aware datetime in the local time zone, to the second, with the zone's name
    (``2026-12-02 09:05:00 UTC``), or its offset when the zone has no name; ``-`` for None."""
    if when is None:
        return "-"
    local = when.astimezone()
    zone = local.strftime("%Z")
    if not zone.isalpha():
        zone = local.strftime("%z")
    return f"{local.strftime('%Y-%m-%d %H:%M:%S')} {zone}"


_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def looks_like_duration(text: str) -> bool:
    """Whether ``text`` reads as a duration `parse_duration` takes."""
    value = text.strip().lower()
    return value == "0" or _DURATION.match(value) is not None


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``2h``, ``3d``, ``1w``, or combined (``1h30m``); ``0`` is zero.

    Raises:
        ValueError: not a duration, or one longer than a `timedelta` can hold.
    """
    value = text.strip().lower()
    if value == "0":
        return timedelta(0)
    if not _DURATION.match(value):
        raise ValueError(f"{text!r} is not a duration such as 30m, 2h, 3d or 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(value))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # also for the float infinity of a number of 309+ digits
        raise ValueError(
            f"{text!r} is too long a duration: at most {timedelta.max.days} days"
        ) from None


def duration_seconds(value: object, what: str) -> float:
    """A duration the API takes (a grace, an age) in seconds: a `timedelta`, a real number of
    seconds, or the CLI's text (``"90s"``, ``"1h30m"``, ``"3d"``), zero or more and at most
    what a `timedelta` holds.

    Raises:
        ValueError: anything else (callers turn it into their own error type).
    """
    if isinstance(value, str):
        try:
            seconds = parse_duration(value).total_seconds()
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past a float's range
            seconds = math.inf
    else:
        raise ValueError(
            f"{what} must be a timedelta, a number of seconds or a duration such as '2h', "
            f"not {type(value).__name__}"
        )
    if not seconds >= 0:  # NaN too
        raise ValueError(f"{what} must be a duration of zero or more seconds")
    if seconds > _MAX_SECONDS:
        raise ValueError(
            f"{what} is out of range: at most {_MAX_SECONDS:.0f} seconds (timedelta.max)"
        )
    return seconds
