"""Numbers and times for people (sizes in binary units, short durations, local times), shared
by the CLI and the web viewer; the viewer must not import the CLI (docs/architecture.md,
"Layers")."""

from __future__ import annotations

from datetime import datetime

__all__ = ["human_duration", "human_size", "local_time"]

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
    """An aware datetime in the local time zone, to the second; ``-`` for None."""
    if when is None:
        return "-"
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")
